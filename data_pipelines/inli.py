"""Reader for Implied NLI (INLI; Havaldar et al., ACL 2025; github google-deepmind/inli).

Each row is one premise with four hypotheses: an explicit entailment, an implied entailment,
a neutral hypothesis and a contradiction. The shipped files are ``data/inli/{train,val,test}.csv``
(data commit d40bfc1; 8000 / 1000 / 1000 rows; CC BY-SA 4.0) with the columns
``<unnamed index>, dataset, premise, implied_entailment, explicit_entailment, neutral,
contradiction``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.paths import data_dir

INLI_COLUMNS = (
    "dataset",
    "premise",
    "implied_entailment",
    "explicit_entailment",
    "neutral",
    "contradiction",
)
SPLITS = {"train": "train.csv", "val": "val.csv", "validation": "val.csv", "test": "test.csv"}


@dataclasses.dataclass(frozen=True)
class INLIExample:
    """One INLI premise with its four hypotheses.

    Attributes:
      premise: the premise text.
      explicit_entailment: a hypothesis the premise states outright.
      implied_entailment: a hypothesis the premise implies without stating it.
      neutral: a hypothesis neither entailed nor contradicted.
      contradiction: a hypothesis the premise contradicts.
      dataset: the source corpus the premise was generated from (circa, ludwig, normbank,
        socialchem).
      line: 1-based line of the row in its CSV file.
    """

    premise: str
    explicit_entailment: str
    implied_entailment: str
    neutral: str
    contradiction: str
    dataset: str
    line: int


def read_inli(path: str | os.PathLike[str]) -> list[INLIExample]:
    """Reads one INLI split file.

    Args:
      path: a CSV file in the INLI format (the unnamed index column is optional and dropped).

    Returns:
      The rows in file order.

    Raises:
      DataError: see :func:`~data_pipelines.csv_reader.read_csv_records` (a missing column,
        an empty sentence, broken quoting, invalid UTF-8, a wrong number of fields).
    """
    return [
        INLIExample(
            premise=r["premise"],
            explicit_entailment=r["explicit_entailment"],
            implied_entailment=r["implied_entailment"],
            neutral=r["neutral"],
            contradiction=r["contradiction"],
            dataset=r["dataset"],
            line=r[LINE_KEY],
        )
        for r in read_csv_records(path, INLI_COLUMNS)
    ]


def inli_split_path(split: str) -> Path:
    """Path of a shipped INLI split: ``data_dir()/inli/{train,val,test}.csv``.

    Args:
      split: "train", "val" (or its tfds name "validation") or "test".

    Raises:
      ValueError: an unknown split name.
      FileNotFoundError: the data folder or the file is missing.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown INLI split {split!r}; expected one of 'train', 'val', 'test'")
    path = data_dir() / "inli" / SPLITS[split]
    if not path.is_file():
        raise FileNotFoundError(f"INLI split file {path} is missing")
    return path
