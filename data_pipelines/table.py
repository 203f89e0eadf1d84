"""The in-memory token table that the input pipeline batches, and text identities.

Kept free of TensorFlow so that building tables (tokenising, caching) stays a light import;
:mod:`data_pipelines.pipeline` re-exports both names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from data_pipelines.tokenization import TokenizedTexts


@dataclasses.dataclass
class TokenTable:
    """A data set of n examples, each made of F token sequences ("fields").

    Attributes:
      input_ids: [n, F, max_len] int32 token ids, right-padded with the tokenizer's pad id.
      token_type_ids: [n, F, max_len] int32 segment ids.
      lengths: [n, F] int32 real tokens per sequence (the attention mask is
        ``arange(max_len) < lengths``).
      text_ids: [n, F] int32 identity of each sequence's underlying text: equal (normalised)
        text gives an equal id, so a loss can refuse a duplicate of the positive as a negative.
      field_names: F names, in the order of the F axis.

    Raises:
      ValueError: inconsistent shapes, lengths outside [0, max_len], or a name count that is
        not F.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    lengths: np.ndarray
    text_ids: np.ndarray
    field_names: tuple[str, ...]

    def __post_init__(self) -> None:
        self.input_ids = np.asarray(self.input_ids, dtype=np.int32)
        self.token_type_ids = np.asarray(self.token_type_ids, dtype=np.int32)
        self.lengths = np.asarray(self.lengths, dtype=np.int32)
        self.text_ids = np.asarray(self.text_ids, dtype=np.int32)
        self.field_names = tuple(self.field_names)
        if self.input_ids.ndim != 3:
            raise ValueError(f"input_ids must be [n, F, max_len], got {self.input_ids.shape}")
        n, f, max_len = self.input_ids.shape
        if self.token_type_ids.shape != (n, f, max_len):
            raise ValueError(
                f"token_type_ids {self.token_type_ids.shape} != input_ids {self.input_ids.shape}"
            )
        for name in ("lengths", "text_ids"):
            shape = getattr(self, name).shape
            if shape != (n, f):
                raise ValueError(f"{name} must be [n, F] = {(n, f)}, got {shape}")
        if len(self.field_names) != f:
            raise ValueError(f"{len(self.field_names)} field names for F={f} fields")
        if n and (self.lengths.min() < 0 or self.lengths.max() > max_len):
            raise ValueError(f"lengths must lie in [0, {max_len}]")

    @property
    def num_examples(self) -> int:
        """n, the number of examples (rows)."""
        return int(self.input_ids.shape[0])

    @property
    def max_len(self) -> int:
        """The padded width of the stored sequences."""
        return int(self.input_ids.shape[2])

    def take(self, n: int) -> TokenTable:
        """The first ``n`` examples in file order (for CPU presets and tests).

        Raises:
          ValueError: ``n`` not in [1, num_examples].
        """
        if not 1 <= n <= self.num_examples:
            raise ValueError(f"take({n}) from a table of {self.num_examples} examples")
        return dataclasses.replace(
            self, input_ids=self.input_ids[:n], token_type_ids=self.token_type_ids[:n],
            lengths=self.lengths[:n], text_ids=self.text_ids[:n])


def normalise_text(text: str) -> str:
    """The form under which two texts count as the same: stripped, casefolded, runs of
    whitespace collapsed to one space."""
    return " ".join(text.split()).casefold()


def text_identity_ids(texts: Sequence[str]) -> np.ndarray:
    """Ids such that texts equal after :func:`normalise_text` get equal ids.

    Args:
      texts: n strings.

    Returns:
      [n] int32; ids are numbered 0, 1, ... in order of first appearance.
    """
    seen: dict[str, int] = {}
    return np.fromiter(
        (seen.setdefault(normalise_text(t), len(seen)) for t in texts),
        dtype=np.int32,
        count=len(texts),
    )


def stack_fields(
    fields: Mapping[str, TokenizedTexts], text_ids: Mapping[str, np.ndarray]
) -> TokenTable:
    """Builds a :class:`TokenTable` from per-field token arrays of equal n and width.

    Args:
      fields: field name -> :class:`TokenizedTexts` ([n, max_len] arrays); the mapping's
        order is the order of the F axis.
      text_ids: field name -> [n] int32 text identities.

    Raises:
      ValueError: the fields differ in n or width, or a field has no text ids.
    """
    names = tuple(fields)
    missing = [name for name in names if name not in text_ids]
    if missing:
        raise ValueError(f"no text ids for fields {missing}")
    widths = {fields[name].input_ids.shape for name in names}
    if len(widths) != 1:
        raise ValueError(f"fields have different [n, max_len] shapes: {sorted(widths)}")
    return TokenTable(
        input_ids=np.stack([fields[name].input_ids for name in names], axis=1),
        token_type_ids=np.stack([fields[name].token_type_ids for name in names], axis=1),
        lengths=np.stack([fields[name].lengths for name in names], axis=1),
        text_ids=np.stack([np.asarray(text_ids[name]) for name in names], axis=1),
        field_names=names,
    )
