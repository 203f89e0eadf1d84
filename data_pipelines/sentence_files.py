"""A user's own sentence tuples for DualCSE and SimCSE (``docs/data.md``, "Your own data").

Two layouts, each as CSV (header row) or JSON Lines (one object a line), read by
:func:`data_pipelines.records.read_records` (local path or ``gs://``):

* DualCSE (INLI-like): ``premise, explicit_entailment, implied_entailment, contradiction``
  and optionally ``neutral`` (unused in training; required in evaluation files, since RTE
  scores all four hypothesis classes) and ``dataset`` (a source label);
* SimCSE: ``anchor, positive`` and optionally ``hard_negative``.
"""

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
    """One SimCSE training row.

    Attributes:
      anchor: the anchor sentence.
      positive: a sentence that should embed close to the anchor.
      hard_negative: a sentence that should embed far from it, or None.
      line: 1-based line of the record in its file.
    """

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
    """Reads a DualCSE file: one premise with its hypotheses per record.

    Args:
      path: CSV or JSON Lines (by extension, else sniffed), local or ``gs://``.
      require_neutral: also require ``neutral`` (evaluation files).

    Returns:
      The records in file order as :class:`~data_pipelines.inli.INLIExample`; an absent
      ``neutral`` or ``dataset`` is ``""``.

    Raises:
      FileNotFoundError: no such file.
      DataError: see :func:`~data_pipelines.records.read_records` (file, line and field).
    """
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
    """Reads a SimCSE file: ``anchor, positive[, hard_negative]`` per record.

    Args:
      path: CSV or JSON Lines (by extension, else sniffed), local or ``gs://``.

    Returns:
      The records in file order; ``hard_negative`` None where absent, null or empty.

    Raises:
      FileNotFoundError: no such file.
      DataError: see :func:`~data_pipelines.records.read_records` (file, line and field).
    """
    try:
        records = read_records(path, ANCHOR_FIELDS, ("hard_negative",))
    except DataError as err:
        raise _with_layout_hint(err, "anchor", "premise", "DualCSE files (premise, "
                                "explicit_entailment, ...) are read with "
                                "--config.architecture=cross or bi") from None
    return [AnchorPair(r["anchor"], r["positive"], r["hard_negative"], r[LINE_KEY])
            for r in records]
