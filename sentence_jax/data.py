"""Training files in sentence-transformers' conventions: JSON Lines, CSV or Parquet, local or
``gs://``; every column but ``label`` / ``score`` is a text, taken by position (anchor,
positive, negatives...), as its losses take them (``docs/sentence.md``, "Data")."""

from __future__ import annotations

import dataclasses
import io
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from embedding_core import DataError, as_path, json_object

LABEL_COLUMNS = ("label", "score")
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclasses.dataclass(frozen=True)
class Columns:
    """A file's ``texts`` ``[n][F]`` under ``names`` (F text columns in file order), its
    ``labels`` ``[n]`` float32 (None: no label column) and each row's 1-based ``lines``."""

    path: str
    names: tuple[str, ...]
    texts: list[tuple[str, ...]]
    labels: np.ndarray | None
    lines: np.ndarray
    label_name: str | None = None

    def __len__(self) -> int:
        return len(self.texts)


def _format(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FORMATS:
        raise DataError(path, None, None, f"unknown file type {suffix or '(none)'!r}: give a "
                        ".jsonl, .json (JSON Lines), .csv or .parquet file")
    return FORMATS[suffix]


def _jsonl_rows(path: str) -> Iterator[tuple[int, dict]]:
    data = as_path(path).read_bytes()
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(path, number, None, "invalid UTF-8") from None
        if text.strip():
            yield number, json_object(path, number, text)


def _csv_rows(path: str) -> Iterator[tuple[int, dict]]:
    for record in read_csv_records(path, (), min_records=0):
        line = int(record.pop(LINE_KEY))
        yield line, record


def _parquet_rows(path: str) -> Iterator[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - tensorflow-datasets depends on pyarrow
        raise DataError(path, None, None, "reading Parquet needs pyarrow (pip install "
                        "pyarrow)") from None
    try:
        table = pq.read_table(io.BytesIO(as_path(path).read_bytes()))
    except Exception as err:  # pyarrow's errors are many classes; the message says which
        raise DataError(path, None, None, f"not a readable Parquet file ({err})") from None
    yield from enumerate(table.to_pylist(), start=1)  # a Parquet "line" is its 1-based row


_READERS = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}


def _label(path: str, line: int, name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        try:
            number = float(str(value).strip())
        except ValueError:
            raise DataError(path, line, name, f"not a number: {value!r}") from None
    if not math.isfinite(number):
        raise DataError(path, line, name, f"not a finite number: {value!r}")
    return number


def _text(path: str, line: int, name: str, value: Any) -> str:
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise DataError(path, line, name, f"a text column holds {kind} {value!r}, not a string")
    if not value.strip():
        raise DataError(path, line, name, "empty text")
    return value


def read_columns(path: str | os.PathLike, *, min_columns: int = 2, max_columns: int | None = None,
                 needs_label: bool = False) -> Columns:
    """The file's rows. Raises FileNotFoundError; DataError (file, line, column): a format, a
    row whose columns differ from the first's, a text that is not a non-empty string, a label
    that is not a finite number, too few or too many text columns for the loss, no rows."""
    path = os.fspath(path)
    kind = _format(path)
    if not as_path(path).exists():
        raise FileNotFoundError(f"{path} does not exist")
    names: tuple[str, ...] | None = None
    label_name = None
    texts: list[tuple[str, ...]] = []
    labels: list[float] = []
    lines: list[int] = []
    for line, record in _READERS[kind](path):
        if names is None:
            labelled = [k for k in record if k in LABEL_COLUMNS]
            if len(labelled) > 1:
                raise DataError(path, line, labelled[1], "two label columns (label and "
                                "score); keep one")
            label_name = labelled[0] if labelled else None
            names = tuple(k for k in record if k not in LABEL_COLUMNS)
            _check_count(path, line, names, min_columns, max_columns, needs_label, label_name)
        if set(record) != {*names, *([label_name] if label_name else [])}:
            missing = sorted(set(names) - set(record))
            extra = sorted(set(record) - set(names) - {label_name})
            raise DataError(path, line, (missing or extra)[0], "the columns differ from the "
                            f"first row's ({'missing' if missing else 'extra'}: "
                            f"{missing or extra})")
        texts.append(tuple(_text(path, line, n, record[n]) for n in names))
        if label_name:
            labels.append(_label(path, line, label_name, record[label_name]))
        lines.append(line)
    if not texts:
        raise DataError(path, None, None, "no rows")
    return Columns(path, names, texts, np.asarray(labels, np.float32) if label_name else None,
                   np.asarray(lines, np.int64), label_name)


def _check_count(path: str, line: int, names: Sequence[str], least: int, most: int | None,
                 needs_label: bool, label_name: str | None) -> None:
    want = f"{least}" if most == least else f"at least {least}" if most is None else \
        f"{least} to {most}"
    if len(names) < least or (most is not None and len(names) > most):
        hint = "two texts and a label or score" if needs_label else \
            "anchor, positive, then negatives"
        raise DataError(path, line, None, f"{len(names)} text column(s) {list(names)}; the "
                        f"loss takes {want} ({hint})")
    if needs_label and label_name is None:
        raise DataError(path, line, None, f"no 'label' or 'score' column; the loss scores "
                        f"pairs (columns {list(names)})")
