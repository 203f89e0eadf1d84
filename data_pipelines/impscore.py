"""Reader and split for ImpScore's implicitness data (Wang et al., ICLR 2025).

The upstream file (github audreycs/ImpScore, ``all_data.csv``; no licence, so not shipped) has
the columns ``pos_implicit, pos_explicit, neg_implicit, neg_explicit``. Each row gives two
(implicit sentence, explicit sentence) pairs: (pos_implicit, pos_explicit) and
(neg_implicit, neg_explicit). DualCSE's EIS evaluation counts a pair as right when the
implicit sentence gets the higher implicitness score.
"""

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
    """One ImpScore row: two (implicit, explicit) sentence pairs.

    Attributes:
      pos_implicit, pos_explicit: the first pair (implicit sentence, explicit sentence).
      neg_implicit, neg_explicit: the second pair.
      line: 1-based line of the row in its CSV file.
    """

    pos_implicit: str
    pos_explicit: str
    neg_implicit: str
    neg_explicit: str
    line: int

    def pairs(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """The row's two ``(implicit, explicit)`` pairs, pos first."""
        return (self.pos_implicit, self.pos_explicit), (self.neg_implicit, self.neg_explicit)


def read_impscore(path: str | os.PathLike[str]) -> list[ImpScoreRow]:
    """Reads an ImpScore-format CSV (extra columns, such as a pandas index, are ignored).

    Raises:
      DataError: see :func:`~data_pipelines.csv_reader.read_csv_records`.
    """
    return [
        ImpScoreRow(
            pos_implicit=r["pos_implicit"],
            pos_explicit=r["pos_explicit"],
            neg_implicit=r["neg_implicit"],
            neg_explicit=r["neg_explicit"],
            line=r[LINE_KEY],
        )
        for r in read_csv_records(path, IMPSCORE_COLUMNS)
    ]


def split_impscore(rows: Sequence[T], seed: int = 42) -> tuple[list[T], list[T], list[T]]:
    """Splits rows into train / valid / test the way ImpScore's protocol does (our reading).

    Our reading of the paper's protocol: Python ``random.seed(42)``; ``random.shuffle(rows)``;
    train = the first ``int(0.9 * N)`` rows, valid = the next ``int(0.05 * N)``, test = the rest.
    A private ``random.Random(seed)`` gives the same order as seeding the global generator
    (same Mersenne Twister seeding), without touching the caller's global random state. The
    input is not modified.

    Args:
      rows: the rows in file order (any element type).
      seed: the shuffle seed; 42 in the protocol.

    Returns:
      (train, valid, test) lists.
    """
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    n = len(shuffled)
    n_train, n_valid = int(0.9 * n), int(0.05 * n)
    return (
        shuffled[:n_train],
        shuffled[n_train : n_train + n_valid],
        shuffled[n_train + n_valid :],
    )
