"""The one-text-a-line reader behind ``export --input`` and query files."""

from __future__ import annotations

import pytest

from data_pipelines.errors import DataError
from embedding_core.storage.text_lines import read_text_lines


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b"one\ntw\x00o\n", 2, "holds a NUL byte (\\x00) at character 3"),
        (b"\x00\n", 1, "holds a NUL byte"),
        (b"one\n\n", 2, "empty sentence"),
        (b"one\n\xff\n", 2, "invalid UTF-8"),
    ],
)
def test_bad_line_is_named(tmp_path, content, line, reason):
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        read_text_lines(path, "sentence")
    assert str(info.value).startswith(f"{path}:{line}: field 'sentence': {reason}")


def test_good_lines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("\ufeffone\r\ntwo  words\n".encode())
    assert read_text_lines(path, "sentence") == ["one", "two  words"]
