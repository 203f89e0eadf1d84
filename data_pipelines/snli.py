"""SNLI triplets ``sent0, sent1, hard_neg`` (premise, entailment, contradiction; SNLI 1.0, CC
BY-SA 4.0), shipped reduced as ``data/snli/snli_train_triplets.csv``; SimCSE's
``nli_for_simcse.csv`` reads the same."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.paths import data_dir

TRIPLET_COLUMNS = ("sent0", "sent1", "hard_neg")


@dataclasses.dataclass(frozen=True)
class Triplet:
    """One (anchor, positive, hard negative) row and its 1-based line."""

    sent0: str
    sent1: str
    hard_neg: str
    line: int


def read_snli_triplets(path: str | os.PathLike[str]) -> list[Triplet]:
    """Reads a ``sent0, sent1, hard_neg`` CSV file. Raises DataError: see
    :func:`~data_pipelines.csv_reader.read_csv_records`."""
    return [Triplet(*(r[k] for k in TRIPLET_COLUMNS), line=r[LINE_KEY])
            for r in read_csv_records(path, TRIPLET_COLUMNS)]


def snli_triplets_path() -> Path:
    """The shipped triplets file. Raises FileNotFoundError: the file is missing."""
    path = data_dir() / "snli" / "snli_train_triplets.csv"
    if not path.is_file():
        raise FileNotFoundError(f"SNLI triplets file {path} is missing")
    return path
