"""The one strict CSV reader (RFC 4180 as ``csv`` or pandas writes it); faults: ``DataError``
(file, physical line, column)."""

from __future__ import annotations

import csv
import ctypes
import io
import os
import sys
from collections.abc import Sequence

from etils import epath

from data_pipelines.errors import DataError

LINE_KEY = "_line"
"""Key of each record's 1-based line number (the line where the record starts)."""

# The csv module refuses fields over 131,072 characters by default; a long document is
# legitimate data. The limit is a C long (32 bits on Windows): sys.maxsize is clipped to it.
csv.field_size_limit(min(sys.maxsize, 2 ** (8 * ctypes.sizeof(ctypes.c_long) - 1) - 1))


def _line_of_offset(prefix: str) -> int:
    # Count line breaks the way csv/io count them with newline="": "\r\n", "\n" and a lone "\r".
    return prefix.count("\n") + prefix.count("\r") - prefix.count("\r\n") + 1


def _decode(path: epath.Path, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        # The bytes before the offending one are valid up to err.start by definition.
        prefix = data[: err.start].decode("utf-8")
        line = _line_of_offset(prefix)
        column = len(prefix) - max(prefix.rfind("\n"), prefix.rfind("\r"))
        bad = data[err.start : err.end].hex(" ")
        raise DataError(path, line, None, f"invalid UTF-8 (byte(s) {bad} at character "
                        f"{column}): {err.reason}") from None
    return text.removeprefix("\ufeff")


def _check_no_nul(path, row: list[str], start_line: int, header: list[str] | None) -> None:
    """Refuses a NUL character (the csv module keeps it; tokenizers drop it)."""
    for index, value in enumerate(row):
        at = value.find("\x00")
        if at < 0:
            continue
        # Quoted fields may span lines: count the breaks before the NUL within the record.
        line = start_line + _line_of_offset("".join(row[:index]) + value[:at]) - 1
        raise DataError(path, line, _column(header, index), "contains a NUL byte (\\x00): the "
                        "file is binary or damaged; remove the byte or export the table again "
                        "as text")


def _column(header: list[str] | None, index: int) -> str:
    if header is None:
        return f"column {index + 1} of the header"
    return header[index] if index < len(header) else f"column {index + 1}"


def _field_index_of_quote_error(record_text: str) -> int:
    """0-based field where a record's quoting goes wrong (the dialect replayed)."""
    field, i, n = 0, 0, len(record_text)
    at_start, in_quotes = True, False
    while i < n:
        c = record_text[i]
        if in_quotes:
            if c == '"':
                if i + 1 < n and record_text[i + 1] == '"':
                    i += 2
                    continue
                in_quotes = False
                if i + 1 < n and record_text[i + 1] not in ',\r\n':
                    return field  # text after the closing quote
        elif c == '"' and at_start:
            in_quotes, at_start = True, False
        elif c == ",":
            field, at_start = field + 1, True
        elif c in "\r\n":
            return field
        else:
            at_start = False
        i += 1
    return field  # end of file inside a quoted field


def read_csv_records(path: str | os.PathLike[str], required_columns: Sequence[str], *,
                     allow_empty: Sequence[str] = (), min_records: int = 1
                     ) -> list[dict[str, str | int]]:
    """One dict per record of a headed CSV (UTF-8, BOM dropped): column -> string, ``"_line"``;
    ``required_columns`` non-blank unless ``allow_empty``. FileNotFoundError; DataError (file, line,
    column): encoding, a NUL, the header, quoting, field counts, empty values, too few rows."""
    path = epath.Path(path)  # a local path or a gs:// URI
    text = _decode(path, path.read_bytes())
    # newline="" keeps line breaks inside quoted fields as they are (the csv module's rule)
    # and makes csv count lines exactly as _line_of_offset does.
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(iter(lines), strict=True)
    required, empty_ok = list(required_columns), set(allow_empty)
    if empty_ok - set(required):
        raise ValueError("allow_empty names columns that are not required: "
                         f"{sorted(empty_ok - set(required))}")
    header: list[str] | None = None
    records: list[dict[str, str | int]] = []
    while True:
        start_line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            index = _field_index_of_quote_error("".join(lines[start_line - 1 :]))
            raise DataError(path, start_line, _column(header, index), "malformed record "
                            f"starting on this line: {err} (detected on line {reader.line_num});"
                            " a quote inside a field must be doubled and the field itself "
                            "quoted") from None
        if not row:
            continue
        _check_no_nul(path, row, start_line, header)
        if header is None:
            header = row
            seen: set[str] = set()
            for name in header:
                if name == LINE_KEY:
                    raise DataError(path, start_line, name,
                                    f"the column name {LINE_KEY!r} is reserved")
                if name in seen:
                    raise DataError(path, start_line, name,
                                    "column name appears twice in the header")
                seen.add(name)
            for name in required:
                if name not in seen:
                    raise DataError(path, start_line, name, "required column missing from the "
                                    f"header; the header is {header}")
            must_fill = [name for name in required if name not in empty_ok]
            continue
        if len(row) != len(header):
            raise DataError(path, start_line, None, f"row has {len(row)} fields, the header "
                            f"has {len(header)} ({header})")
        record: dict[str, str | int] = dict(zip(header, row, strict=True))
        for name in must_fill:
            if not record[name].strip():
                raise DataError(path, start_line, name, "empty or whitespace-only value")
        record[LINE_KEY] = start_line
        records.append(record)
    if header is None:
        raise DataError(path, None, None, "file has no header row (it is empty)")
    if len(records) < min_records:
        raise DataError(path, None, None, f"{len(records)} records after the header; at least "
                        f"{min_records} needed")
    return records
