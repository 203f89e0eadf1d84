"""Reader for the shipped SNLI triplets (the supervised-SimCSE layout).

``data/snli/snli_train_triplets.csv`` has the columns ``sent0, sent1, hard_neg``: a premise,
its entailment hypothesis and its contradiction hypothesis (SNLI 1.0, Bowman et al. 2015,
CC BY-SA 4.0; reduced to the premises of the first 100,000 training pairs that have both an
entailment and a contradiction; 27,195 triplets). SimCSE's own ``nli_for_simcse.csv`` has the
same columns and can be read with the same function.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.paths import data_dir

TRIPLET_COLUMNS = ("sent0", "sent1", "hard_neg")


@dataclasses.dataclass(frozen=True)
class Triplet:
    """One (anchor, positive, hard negative) triplet.

    Attributes:
      sent0: the anchor (an SNLI premise).
      sent1: the positive (its entailment hypothesis).
      hard_neg: the hard negative (its contradiction hypothesis).
      line: 1-based line of the row in its CSV file.
    """

    sent0: str
    sent1: str
    hard_neg: str
    line: int


def read_snli_triplets(path: str | os.PathLike[str]) -> list[Triplet]:
    """Reads a ``sent0, sent1, hard_neg`` CSV file.

    Raises:
      DataError: see :func:`~data_pipelines.csv_reader.read_csv_records`.
    """
    return [
        Triplet(sent0=r["sent0"], sent1=r["sent1"], hard_neg=r["hard_neg"], line=r[LINE_KEY])
        for r in read_csv_records(path, TRIPLET_COLUMNS)
    ]


def snli_triplets_path() -> Path:
    """Path of the shipped ``data_dir()/snli/snli_train_triplets.csv``.

    Raises:
      FileNotFoundError: the data folder or the file is missing.
    """
    path = data_dir() / "snli" / "snli_train_triplets.csv"
    if not path.is_file():
        raise FileNotFoundError(f"SNLI triplets file {path} is missing")
    return path
