"""The pair and triplet evaluators' files: CSV with a header row, or JSON Lines; every
fault a ``DataError(path, line, field, reason)``."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from typing import Any

from embedding_core.errors import DataError, json_object
from embedding_core.storage import storage

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


def _decode(where: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(where, line, None, f"invalid UTF-8: {err.reason}") from None
    return text.removeprefix("\ufeff")


def _is_jsonl(path: str, text: str) -> bool:
    """By the suffix; otherwise a file whose first non-blank character is ``{``."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".csv":
        return False
    return suffix in _JSONL_SUFFIXES or text.lstrip()[:1] == "{"


def _csv_rows(where: str, text: str, fields: Sequence[str]):
    """Yields ``(line, {field: str})`` for each non-blank CSV record after the header."""
    # newline="" keeps line breaks inside quoted fields, so reader.line_num counts physical lines.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    start = 1
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                pass
            elif header is None:
                header = [name.strip() for name in row]
                missing = [name for name in fields if name not in header]
                if missing:
                    raise DataError(where, start, missing[0],
                                    f"missing from the header {header}")
            elif len(row) != len(header):
                raise DataError(where, start, None,
                                f"{len(row)} fields, the header has {len(header)}")
            else:
                yield start, dict(zip(header, row, strict=True))
            start = reader.line_num + 1
    except csv.Error as err:
        raise DataError(where, start, None, f"malformed CSV record: {err}") from None


def _jsonl_rows(where: str, text: str):
    """Yields ``(line, object)`` for each non-blank line."""
    for line, raw in enumerate(text.split("\n"), start=1):
        if raw.strip():
            yield line, json_object(where, line, raw,
                                    invalid="invalid JSON: {msg} at character {colno}",
                                    not_object="expected one JSON object per line")


def _text(where: str, line: int, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DataError(where, line, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        # An encoder refuses an empty text; better to say where it is in the file.
        raise DataError(where, line, field, "empty text")
    return value


def _number(where: str, line: int, field: str, value: Any) -> float:
    # bool is an int in Python; true/false in a score column is a mistake, not 1/0.
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise DataError(where, line, field, f"not a number: {value!r}") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise DataError(where, line, field, f"not a number: {value!r}")
    if not math.isfinite(number):
        raise DataError(where, line, field, f"not a finite number: {value!r}")
    return number


def _label(where: str, line: int, field: str, value: Any) -> int:
    number = _number(where, line, field, value)
    if number not in (0.0, 1.0):
        raise DataError(where, line, field, f"label must be 0 or 1, got {value!r}")
    return int(number)


def read_columns(path: str | os.PathLike, text_fields: Sequence[str],
                 score_field: str | None = None, *, binary: bool = False
                 ) -> tuple[list[list[str]], list[float] | list[int] | None]:
    """``(texts, numbers)``: ``texts[k][i]`` = ``text_fields[k]`` of record i; ``numbers``
    the float ``score_field`` (``binary``: 0/1 int), None without one.
    Raises: FileNotFoundError; DataError: invalid UTF-8, CSV or JSON; a missing field, an
    empty text, a bad score or label; no records."""
    where = os.fspath(path)
    file = storage.as_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{where}: no such file")
    text = _decode(where, file.read_bytes())
    fields = [*text_fields, *([score_field] if score_field else [])]
    if _is_jsonl(where, text):
        rows = _jsonl_rows(where, text)
    else:
        rows = _csv_rows(where, text, fields)
    texts: list[list[str]] = [[] for _ in text_fields]
    numbers: list[Any] = []
    for line, row in rows:
        for name in fields:
            if name not in row:
                raise DataError(where, line, name, f"missing (the record has {sorted(row)})")
        for column, name in zip(texts, text_fields, strict=True):
            column.append(_text(where, line, name, row[name]))
        if score_field:
            read = _label if binary else _number
            numbers.append(read(where, line, score_field, row[score_field]))
    if not texts[0]:
        raise DataError(where, None, None, "no records (the file is empty)")
    return texts, (numbers if score_field else None)
