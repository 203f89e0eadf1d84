"""Strict CSV reading: every fault names the right file, physical line and field."""

from __future__ import annotations

import pytest

from data_pipelines.csv_reader import read_csv_records
from data_pipelines.errors import DataError
from data_pipelines.inli import read_inli

HEADER = ",dataset,premise,implied_entailment,explicit_entailment,neutral,contradiction\n"
GOOD_1 = "0,circa,A premise.,Implied.,Explicit.,Neutral.,Contra.\n"
# A quoted premise spanning lines 3-5 (three physical lines), so later line numbers are only
# right if the reader counts the lines inside quoted fields.
MULTILINE = '1,circa,"First line of it,\nsecond line ""quoted"",\nthird line.",I2.,E2.,N2.,C2.\n'


def _write(tmp_path, text: str | bytes, name: str = "split.csv"):
    path = tmp_path / name
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    return path


def _raises(path) -> DataError:
    with pytest.raises(DataError) as info:
        read_inli(path)
    err = info.value
    assert err.path == str(path)
    if err.line is not None:
        assert str(err).startswith(f"{path}:{err.line}: ")
    return err


def test_good_file_lines_and_multiline_values(tmp_path):
    path = _write(tmp_path, HEADER + GOOD_1 + MULTILINE + "2,ludwig,P3,I3,E3,N3,C3\n")
    rows = read_inli(path)
    assert [r.line for r in rows] == [2, 3, 6]
    assert rows[1].premise == 'First line of it,\nsecond line "quoted",\nthird line.'
    assert (rows[2].dataset, rows[2].implied_entailment, rows[2].explicit_entailment) == (
        "ludwig", "I3", "E3")


def test_crlf_line_endings_count_one_line_each(tmp_path):
    text = (HEADER + GOOD_1 + MULTILINE + "2,ludwig,P3,I3,E3,N3, \n").replace("\n", "\r\n")
    err = _raises(_write(tmp_path, text))
    assert (err.line, err.field) == (6, "contradiction")


def test_missing_column_names_column_and_header(tmp_path):
    header = HEADER.replace(",neutral", "")
    path = _write(tmp_path, header + "0,circa,P,I,E,C\n")
    err = _raises(path)
    assert (err.line, err.field) == (1, "neutral")
    assert "'premise'" in err.reason  # the header is listed


def test_empty_sentence(tmp_path):
    path = _write(tmp_path, HEADER + GOOD_1 + MULTILINE + "2,ludwig,P3,I3,  ,N3,C3\n")
    err = _raises(path)
    assert (err.line, err.field) == (6, "explicit_entailment")
    assert str(err) == f"{path}:6: field 'explicit_entailment': empty or whitespace-only value"


def test_unterminated_quote_at_end_reports_record_start(tmp_path):
    path = _write(
        tmp_path, HEADER + MULTILINE + GOOD_1 + '2,ludwig,P3,I3,E3,"never closed,C3\n7,x,y\n'
    )
    err = _raises(path)
    assert (err.line, err.field) == (6, "neutral")
    assert "detected on line 7" in err.reason  # the quote swallowed the rest of the file


def test_text_after_closing_quote(tmp_path):
    path = _write(tmp_path, HEADER + MULTILINE + '2,ludwig,"P3" oops,I3,E3,N3,C3\n' + GOOD_1)
    err = _raises(path)
    assert (err.line, err.field) == (5, "premise")


def test_invalid_utf8_line(tmp_path):
    data = (HEADER + MULTILINE + GOOD_1).encode() + b"2,ludwig,caf\xe9 au lait,I,E,N,C\n"
    err = _raises(_write(tmp_path, data))
    assert err.line == 6
    assert "e9" in err.reason


def test_invalid_utf8_inside_multiline_field(tmp_path):
    bad = MULTILINE.replace("third", "th\xffird").encode("latin-1")
    err = _raises(_write(tmp_path, HEADER.encode() + GOOD_1.encode() + bad))
    assert err.line == 5  # the third physical line of the record that starts on line 3


def test_nul_byte_names_line_and_field(tmp_path):
    # A NUL in the third physical line of a quoted multi-line premise (record on lines 3-5).
    bad = MULTILINE.replace("third", "th\x00ird")
    err = _raises(_write(tmp_path, HEADER + GOOD_1 + bad))
    assert (err.line, err.field) == (5, "premise")
    assert "NUL byte" in err.reason
    err = _raises(_write(tmp_path, HEADER + GOOD_1 + "1,circa,P,I,E,N\x00,C\n"))
    assert (err.line, err.field) == (3, "neutral")
    err = _raises(_write(tmp_path, HEADER.replace("dataset", "data\x00set") + GOOD_1))
    assert (err.line, err.field) == (1, "column 2 of the header")


def test_wrong_field_count(tmp_path):
    path = _write(tmp_path, HEADER + MULTILINE + "2,ludwig,P3,I3,E3,N3,C3,extra\n")
    err = _raises(path)
    assert (err.line, err.field) == (5, None)
    assert "8 fields" in err.reason and "7" in err.reason


def test_empty_file_and_allow_empty(tmp_path):
    with pytest.raises(DataError, match="no header"):
        read_csv_records(_write(tmp_path, ""), ["a"])
    path = _write(tmp_path, "a,b\n1,\n", name="b.csv")
    assert read_csv_records(path, ["a", "b"], allow_empty=["b"]) == [
        {"a": "1", "b": "", "_line": 2}
    ]
    with pytest.raises(DataError) as info:
        read_csv_records(path, ["a", "b"])
    assert (info.value.line, info.value.field) == (2, "b")
    header_only = _write(tmp_path, "a,b\n\n", name="c.csv")
    with pytest.raises(DataError, match=r"c\.csv: 0 records after the header"):
        read_csv_records(header_only, ["a", "b"])
    assert read_csv_records(header_only, ["a", "b"], min_records=0) == []


def test_blank_lines_skipped_but_counted(tmp_path):
    path = _write(tmp_path, "\ufeffa,b\n\n1,2\n\n3,4\n")
    assert [r["_line"] for r in read_csv_records(path, ["a", "b"])] == [3, 5]
