"""The in-memory token table that the input pipeline batches, and text identities (no TF)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from data_pipelines.tokenization import TokenizedTexts


@dataclasses.dataclass
class TokenTable:
    """n examples of F token sequences: ``input_ids``, ``token_type_ids`` [n, F, max_len] int32,
    ``lengths``, ``text_ids`` [n, F] int32; ValueError: inconsistent shapes or names."""

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
            raise ValueError(f"token_type_ids {self.token_type_ids.shape} != input_ids "
                             f"{self.input_ids.shape}")
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
        return int(self.input_ids.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.input_ids.shape[2])

    def take(self, n: int) -> TokenTable:
        """The first ``n`` examples. Raises ValueError: ``n`` not in [1, num_examples]."""
        if not 1 <= n <= self.num_examples:
            raise ValueError(f"take({n}) from a table of {self.num_examples} examples")
        return dataclasses.replace(
            self, input_ids=self.input_ids[:n], token_type_ids=self.token_type_ids[:n],
            lengths=self.lengths[:n], text_ids=self.text_ids[:n])


def normalise_text(text: str) -> str:
    """Stripped, casefolded, whitespace runs collapsed: when two texts are the same."""
    return " ".join(text.split()).casefold()


def text_identity_ids(texts: Sequence[str]) -> np.ndarray:
    """[n] int32 ids, equal for texts equal after :func:`normalise_text`, by first appearance."""
    seen: dict[str, int] = {}
    return np.fromiter((seen.setdefault(normalise_text(t), len(seen)) for t in texts),
                       dtype=np.int32, count=len(texts))


def stack_fields(fields: Mapping[str, TokenizedTexts], text_ids: Mapping[str, np.ndarray]
                 ) -> TokenTable:
    """A :class:`TokenTable` from ``{field: TokenizedTexts}`` (order = F axis) and text ids;
    ValueError: fields differ in n or width, or lack ids."""
    names = tuple(fields)
    missing = [name for name in names if name not in text_ids]
    if missing:
        raise ValueError(f"no text ids for fields {missing}")
    widths = {fields[name].input_ids.shape for name in names}
    if len(widths) != 1:
        raise ValueError(f"fields have different [n, max_len] shapes: {sorted(widths)}")
    def stack(key: str) -> np.ndarray:
        return np.stack([getattr(fields[name], key) for name in names], axis=1)

    return TokenTable(input_ids=stack("input_ids"), token_type_ids=stack("token_type_ids"),
                      lengths=stack("lengths"), field_names=names,
                      text_ids=np.stack([np.asarray(text_ids[name]) for name in names], axis=1))
