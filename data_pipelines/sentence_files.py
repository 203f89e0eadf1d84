"""A user's own DualCSE / SimCSE rows, CSV or JSON Lines (docs/data.md, "Your own data")."""

from __future__ import annotations

import dataclasses
import os

from data_pipelines.csv_reader import LINE_KEY
from data_pipelines.errors import DataError
from data_pipelines.inli import INLIExample
from data_pipelines.records import read_records

INLI_FIELDS = ("premise", "explicit_entailment", "implied_entailment", "contradiction")
"""Required fields of a DualCSE file (``neutral`` and ``dataset`` are optional)."""
ANCHOR_FIELDS = ("anchor", "positive")
"""Required fields of a SimCSE file (``hard_negative`` is optional)."""


@dataclasses.dataclass(frozen=True)
class AnchorPair:
    """One SimCSE row: anchor, positive, hard negative (or None) and 1-based line."""

    anchor: str
    positive: str
    hard_negative: str | None
    line: int


def _with_layout_hint(err: DataError, wanted: str, other: str, hint: str) -> DataError:
    # A file of the other layout fails on its first required field (the message lists the
    # header or the record's keys): say what would read it.
    if (err.field == wanted and err.reason.startswith(("required column missing", "missing"))
            and repr(other) in err.reason):
        return DataError(err.path, err.line, err.field, f"{err.reason}; {hint}")
    return err


def read_inli_file(path: str | os.PathLike[str], *, require_neutral: bool = False
                   ) -> list[INLIExample]:
    """A DualCSE file (``require_neutral``: evaluation); absent ``neutral`` / ``dataset``:
    ``""``; FileNotFoundError, DataError (a SimCSE file named as such)."""
    required = (*INLI_FIELDS, "neutral") if require_neutral else INLI_FIELDS
    optional = ("dataset",) if require_neutral else ("neutral", "dataset")
    try:
        records = read_records(path, required, optional)
    except DataError as err:
        raise _with_layout_hint(err, "premise", "anchor", "SimCSE files (anchor, positive) "
                                "are read with --config.architecture=simcse") from None
    return [
        INLIExample(premise=r["premise"], explicit_entailment=r["explicit_entailment"],
                    implied_entailment=r["implied_entailment"], neutral=r["neutral"] or "",
                    contradiction=r["contradiction"], dataset=r["dataset"] or "",
                    line=r[LINE_KEY])
        for r in records
    ]


def read_anchor_pairs(path: str | os.PathLike[str]) -> list[AnchorPair]:
    """A SimCSE file (``hard_negative`` None if absent or empty); FileNotFoundError, DataError."""
    try:
        records = read_records(path, ANCHOR_FIELDS, ("hard_negative",))
    except DataError as err:
        raise _with_layout_hint(err, "anchor", "premise", "DualCSE files (premise, "
                                "explicit_entailment, ...) are read with "
                                "--config.architecture=cross or bi") from None
    return [AnchorPair(r["anchor"], r["positive"], r["hard_negative"], r[LINE_KEY])
            for r in records]
