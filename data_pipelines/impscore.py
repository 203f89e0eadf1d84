"""ImpScore's implicitness data (Wang et al., ICLR 2025; ``all_data.csv``, not shipped), two
(implicit, explicit) pairs per row (``docs/dualcse.md``, "EIS protocol")."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Sequence
from typing import TypeVar

from data_pipelines.csv_reader import LINE_KEY, read_csv_records

IMPSCORE_COLUMNS = ("pos_implicit", "pos_explicit", "neg_implicit", "neg_explicit")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ImpScoreRow:
    """One ImpScore row: two (implicit, explicit) pairs and its 1-based line."""

    pos_implicit: str
    pos_explicit: str
    neg_implicit: str
    neg_explicit: str
    line: int

    def pairs(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """The row's two ``(implicit, explicit)`` pairs, pos first."""
        return (self.pos_implicit, self.pos_explicit), (self.neg_implicit, self.neg_explicit)


def read_impscore(path: str | os.PathLike[str]) -> list[ImpScoreRow]:
    """Reads an ImpScore-format CSV (extra columns ignored); DataError."""
    return [ImpScoreRow(*(r[k] for k in IMPSCORE_COLUMNS), line=r[LINE_KEY])
            for r in read_csv_records(path, IMPSCORE_COLUMNS)]


def impscore_split_indices(n: int, seed: int = 42) -> tuple[list[int], list[int], list[int]]:
    """``(train, valid, test)`` rows as ImpScore's code draws them after ``random.seed(42)``
    (sizes ``int(n*0.9)``, ``int(n*0.05)``, rest), a private generator; ValueError: ``n`` < 0."""
    if n < 0:
        raise ValueError(f"impscore_split_indices: n must be >= 0, got {n}")
    rng = random.Random(seed)
    # int(n * (1 - 0.05 * 2)) in the original: the same float as 0.9.
    n_train, n_valid = int(n * 0.9), int(n * 0.05)
    train = rng.sample(range(n), n_train)
    valid = rng.sample(list(set(range(n)) - set(train)), n_valid)
    test = list(set(range(n)) - set(train) - set(valid))
    return train, valid, test


def split_impscore(rows: Sequence[T], seed: int = 42) -> tuple[list[T], list[T], list[T]]:
    """``rows`` split into (train, valid, test) lists by :func:`impscore_split_indices`."""
    train, valid, test = impscore_split_indices(len(rows), seed)
    return ([rows[i] for i in train], [rows[i] for i in valid], [rows[i] for i in test])
