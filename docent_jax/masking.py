"""BERT-style masking in the jitted loss, from the step key (``docs/docent.md``)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

ENTITY_POSITION = 1
"""Index of the entity token in a DocEnt-Full input ``[CLS] <entity> [SEP] sentence [SEP]``."""


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How word pieces and entity tokens (ids from ``word_vocab_size``) are masked; specials
    never."""

    mask_token_id: int
    word_vocab_size: int
    special_token_ids: tuple[int, ...]
    word_mask_rate: float = 0.15
    entity_mask_rate: float = 0.15
    max_predictions: int = 20
    mask_prob: float = 0.8
    random_prob: float = 0.1

    def __post_init__(self) -> None:
        for name in ("word_mask_rate", "entity_mask_rate", "mask_prob", "random_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MaskingConfig.{name} must lie in [0, 1], got "
                                 f"{getattr(self, name)}")
        if self.mask_prob + self.random_prob > 1.0:
            raise ValueError("MaskingConfig.mask_prob + random_prob must be <= 1, got "
                             f"{self.mask_prob} + {self.random_prob}")
        if self.max_predictions < 1:
            raise ValueError(f"MaskingConfig.max_predictions must be >= 1, got "
                             f"{self.max_predictions}")
        if not 0 <= self.mask_token_id < self.word_vocab_size:
            raise ValueError(f"MaskingConfig.mask_token_id {self.mask_token_id} is not a word "
                             f"piece id (vocabulary size {self.word_vocab_size})")

    @classmethod
    def from_tokenizer(cls, tokenizer, **fields: Any) -> MaskingConfig:
        """From a BERT tokenizer; ValueError: no ``[MASK]`` token."""
        mask = tokenizer.token_to_id("[MASK]")
        if mask is None:
            raise ValueError("the tokenizer has no [MASK] token; DocEnt's MLM needs a BERT "
                             "word-piece vocabulary")
        specials = tuple(
            i for i in (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))
            if i is not None)
        return cls(mask_token_id=int(mask), word_vocab_size=int(tokenizer.get_vocab_size()),
                   special_token_ids=specials, **fields)


class MaskedTokens(NamedTuple):
    """Masked ``input_ids`` ``[batch, seq]``; ``positions``, ``labels`` ``[batch, P]`` int32;
    ``weights`` ``[batch, P]`` float32 (0: an unused slot)."""

    input_ids: jax.Array
    positions: jax.Array
    labels: jax.Array
    weights: jax.Array


def maskable_word_pieces(input_ids: jax.Array, attention_mask: jax.Array,
                         masking: MaskingConfig) -> jax.Array:
    """``[batch, seq_len]`` bool: real, non-special word pieces (no entity token)."""
    input_ids = jnp.asarray(input_ids)
    ok = (jnp.asarray(attention_mask) != 0) & (input_ids < masking.word_vocab_size)
    for special in masking.special_token_ids:
        ok &= input_ids != special
    return ok


def mask_word_pieces(rng: jax.Array, input_ids: jax.Array, maskable: jax.Array,
                     masking: MaskingConfig) -> MaskedTokens:
    """BERT's masking (Devlin et al. 2019, A.1): ``k = min(floor(n * rate + u), P, n)`` of the
    ``maskable`` ids, 80/10/10; :class:`MaskedTokens` of ``P = min(max_predictions, seq_len)``."""
    input_ids, maskable = jnp.asarray(input_ids), jnp.asarray(maskable)
    batch, seq_len = input_ids.shape
    slots = min(masking.max_predictions, seq_len)
    k_count, k_pick, k_mode, k_rand = jax.random.split(rng, 4)
    n = jnp.sum(maskable, axis=1).astype(jnp.float32)
    u = jax.random.uniform(k_count, (batch,))
    count = jnp.floor(n * masking.word_mask_rate + u).astype(jnp.int32)
    count = jnp.minimum(count, jnp.minimum(n.astype(jnp.int32), slots))
    # A random order of the maskable positions: the `count` smallest keys are taken.
    keys = jnp.where(maskable, jax.random.uniform(k_pick, (batch, seq_len)), 2.0)
    _, positions = jax.lax.top_k(-keys, slots)
    positions = positions.astype(jnp.int32)
    selected = jnp.arange(slots)[None, :] < count[:, None]
    labels = jnp.take_along_axis(input_ids, positions, axis=1)
    mode = jax.random.uniform(k_mode, (batch, slots))
    random_ids = jax.random.randint(k_rand, (batch, slots), 0, masking.word_vocab_size,
                                    dtype=input_ids.dtype)
    new = jnp.where(mode < masking.mask_prob, masking.mask_token_id,
                    jnp.where(mode < masking.mask_prob + masking.random_prob, random_ids, labels))
    new = jnp.where(selected, new, labels).astype(input_ids.dtype)
    rows = jnp.arange(batch)[:, None]
    # top_k returns distinct positions per row, so the scatter has no conflicting writes.
    corrupted = input_ids.at[rows, positions].set(new)
    return MaskedTokens(corrupted, positions, labels.astype(jnp.int32),
                        selected.astype(jnp.float32))


def mask_entity_tokens(rng: jax.Array, input_ids: jax.Array,
                       masking: MaskingConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The entity token becomes ``[MASK]`` with ``entity_mask_rate`` (no 80/10/10): ``(ids,
    labels [batch] int32, weights [batch] float32)``; rows without one never masked."""
    input_ids = jnp.asarray(input_ids)
    labels = input_ids[:, ENTITY_POSITION]
    draw = jax.random.uniform(rng, labels.shape) < masking.entity_mask_rate
    masked = draw & (labels >= masking.word_vocab_size)
    column = jnp.where(masked, masking.mask_token_id, labels).astype(input_ids.dtype)
    return (input_ids.at[:, ENTITY_POSITION].set(column), labels.astype(jnp.int32),
            masked.astype(jnp.float32))
