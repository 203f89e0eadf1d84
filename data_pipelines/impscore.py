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


def impscore_split_indices(n: int, seed: int = 42) -> tuple[list[int], list[int], list[int]]:
    """Row indices of ImpScore's train / valid / test split of ``n`` rows.

    ImpScore's own code (``docs/dualcse.md``, "EIS protocol") seeds Python's global
    generator with ``random.seed(42)`` and then draws, with nothing else drawn first::

        train = random.sample(range(n), int(n * 0.9))
        valid = random.sample(list(set(range(n)) - set(train)), int(n * 0.05))
        test  = list(set(range(n)) - set(train) - set(valid))

    A private ``random.Random(seed)`` gives the same draws as seeding the global generator
    (same Mersenne Twister seeding) without touching the caller's random state. The valid
    draw samples from a list in ``set`` iteration order, as the original does: for ints
    that order is fixed by CPython's set layout (an int hashes to itself; no hash
    randomisation), not sorted, so sorting first would pick other rows.

    Args:
      n: number of rows (the CSV's data rows, header excluded).
      seed: 42 in ImpScore.

    Returns:
      ``(train, valid, test)`` index lists, in ImpScore's order; sizes ``int(n * 0.9)``,
      ``int(n * 0.05)`` and the rest.

    Raises:
      ValueError: ``n`` negative.
    """
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
    """Splits rows into train / valid / test as ImpScore's own code does
    (:func:`impscore_split_indices`; ``docs/dualcse.md``, "EIS protocol").

    Args:
      rows: the rows in file order (any element type); not modified.
      seed: 42 in ImpScore.

    Returns:
      (train, valid, test) lists of rows, each in ImpScore's order.
    """
    train, valid, test = impscore_split_indices(len(rows), seed)
    return ([rows[i] for i in train], [rows[i] for i in valid], [rows[i] for i in test])
