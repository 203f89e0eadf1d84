"""Plain text files of one text per line (sentences to export, queries to rank)."""

from __future__ import annotations

import os

from embedding_core.errors import DataError
from embedding_core.storage import storage


def read_text_lines(path: str | os.PathLike, what: str = "text", flag: str = "--input"
                    ) -> list[str]:
    """One ``what`` per line, strict UTF-8 (a line's ``\\r`` and a leading BOM dropped).

    Raises: FileNotFoundError, IsADirectoryError (naming ``flag``); DataError: invalid
    UTF-8, a NUL byte, a carriage return inside a line, an empty line, no line at all."""
    path = storage.as_path(path)
    if not path.exists():
        raise FileNotFoundError(f"{flag} {path} does not exist")
    if not path.is_file():
        raise IsADirectoryError(f"{flag} {path} is not a file; give a text file, one "
                                f"{what} a line")
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line, it does not start one
    texts = []
    for lineno, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise DataError(path, lineno, what, f"invalid UTF-8 ({e.reason})") from None
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the text
        if "\r" in text:
            raise DataError(path, lineno, what, "a carriage return inside the line (one "
                            f"{what} a line, lines end with \\n or \\r\\n)")
        if "\x00" in text:
            raise DataError(path, lineno, what, f"holds a NUL byte (\\x00) at character "
                            f"{text.index(chr(0)) + 1}: the file is binary or damaged; "
                            f"remove the byte (one {what} a line)")
        if not text.strip():
            raise DataError(path, lineno, what, f"empty {what}")
        texts.append(text)
    if not texts:
        raise DataError(path, None, what, f"no {what} in file")
    return texts
