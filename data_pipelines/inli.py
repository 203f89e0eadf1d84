"""Implied NLI (Havaldar et al., ACL 2025; google-deepmind/inli d40bfc1, CC BY-SA 4.0), shipped
as ``data/inli/{train,val,test}.csv`` (``docs/data.md``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.paths import data_dir

INLI_COLUMNS = ("dataset", "premise", "implied_entailment", "explicit_entailment", "neutral",
                "contradiction")
SPLITS = {"train": "train.csv", "val": "val.csv", "validation": "val.csv", "test": "test.csv"}


@dataclasses.dataclass(frozen=True)
class INLIExample:
    """One premise with its four hypotheses, its source ``dataset`` and 1-based line."""

    premise: str
    explicit_entailment: str
    implied_entailment: str
    neutral: str
    contradiction: str
    dataset: str
    line: int


def read_inli(path: str | os.PathLike[str]) -> list[INLIExample]:
    """One INLI split file's rows in file order; DataError."""
    names = [f.name for f in dataclasses.fields(INLIExample)][:-1]  # all but line
    return [INLIExample(*(r[k] for k in names), line=r[LINE_KEY])
            for r in read_csv_records(path, INLI_COLUMNS)]


def inli_split_path(split: str) -> Path:
    """The shipped split (``"val"`` or ``"validation"``); ValueError, FileNotFoundError."""
    if split not in SPLITS:
        raise ValueError(f"unknown INLI split {split!r}; expected one of 'train', 'val', 'test'")
    path = data_dir() / "inli" / SPLITS[split]
    if not path.is_file():
        raise FileNotFoundError(f"INLI split file {path} is missing")
    return path
