"""Readers of DocEnt's corpora (formats: ``docs/data.md``)."""

from __future__ import annotations

import os

from data_pipelines.csv_reader import LINE_KEY
from data_pipelines.errors import DataError

PathLike = str | os.PathLike[str]


def decode_utf8(path: PathLike, data: bytes, field: str | None = None, first_line: int = 1) -> str:
    """``data`` as UTF-8. Raises DataError naming ``path``, the line and ``field``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data[: err.start].count(b"\n")
        raise DataError(path, line, field, f"invalid UTF-8: {err.reason}") from None


def csv_int(record: dict, column: str, path: PathLike) -> int:
    """``int(record[column])`` of a CSV record. Raises DataError (file, line, column)."""
    value = record[column]
    try:
        return int(value)
    except ValueError:
        raise DataError(path, record[LINE_KEY], column,
                        f"expected an integer, got {value!r}") from None
