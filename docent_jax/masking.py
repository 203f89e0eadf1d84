"""BERT-style masking of DocEnt-Full and -Hybrid batches, inside the jitted loss.

Masks are drawn in JAX from the step key over the global array, so they depend only on
(seed, step, batch): a resumed run and any mesh draw the same masks (``docs/docent.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

ENTITY_POSITION = 1
"""Index of the entity token in a DocEnt-Full input ``[CLS] <entity> [SEP] sentence [SEP]``."""


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How word pieces and entity tokens are masked.

    Attributes:
      mask_token_id: id of ``[MASK]`` (103 for BERT uncased vocabularies).
      word_vocab_size: word-piece vocabulary size; ids at or above it are entity tokens.
      special_token_ids: ids never masked (``[CLS]``, ``[SEP]``, ``[PAD]``, ``[MASK]``).
      word_mask_rate: expected fraction of a sentence's maskable word pieces that are
        predicted (BERT 0.15).
      entity_mask_rate: probability that an example's entity token is replaced by
        ``[MASK]`` and predicted (DocEnt-Full only; the paper's footnote 5 calls the relative
        masking frequency of entities a hyperparameter; 0.15 treats it like any token).
      max_predictions: most predicted word pieces per sequence (BERT's
        ``max_predictions_per_seq``, 20 for 128 tokens); bounds the ``[batch, P, vocab]``
        logits.
      mask_prob, random_prob: BERT's 80/10/10 rule: of the selected word pieces
        ``mask_prob`` become ``[MASK]``, ``random_prob`` a uniformly random word piece and the
        rest are kept unchanged (still predicted).
    """

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
        """Reads ``[MASK]``, the special tokens and the vocabulary size from a BERT
        ``tokenizers.Tokenizer``; ``fields`` set the rates and limits.

        Raises:
          ValueError: the tokenizer has no ``[MASK]`` token.
        """
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
    """Word-piece masking of a batch.

    Attributes:
      input_ids: ``[batch, seq_len]`` int32 ids after the 80/10/10 replacement.
      positions: ``[batch, P]`` int32 positions of the predictions (slots with weight 0 point
        at an arbitrary position and are ignored).
      labels: ``[batch, P]`` int32 original ids at ``positions``.
      weights: ``[batch, P]`` float32, 1 for a prediction, 0 for an unused slot.
    """

    input_ids: jax.Array
    positions: jax.Array
    labels: jax.Array
    weights: jax.Array


def maskable_word_pieces(input_ids: jax.Array, attention_mask: jax.Array,
                         masking: MaskingConfig) -> jax.Array:
    """``[batch, seq_len]`` bool: real tokens that are word pieces and not special tokens
    (so never ``[CLS]``, ``[SEP]``, padding or an entity token)."""
    input_ids = jnp.asarray(input_ids)
    ok = (jnp.asarray(attention_mask) != 0) & (input_ids < masking.word_vocab_size)
    for special in masking.special_token_ids:
        ok &= input_ids != special
    return ok


def mask_word_pieces(rng: jax.Array, input_ids: jax.Array, maskable: jax.Array,
                     masking: MaskingConfig) -> MaskedTokens:
    """BERT masked-LM corruption (Devlin et al. 2019, sec. 3.1, appendix A.1).

    Per sequence with ``n`` maskable tokens, ``k = min(floor(n * rate + u), P, n)`` with
    ``u ~ U[0, 1)`` positions are drawn uniformly without replacement (stochastic rounding:
    ``E[k] = n * rate`` exactly unless the ``P = max_predictions`` cap binds; BERT's data
    script uses ``round``); each is replaced by ``[MASK]`` (``mask_prob``), a uniformly
    random word piece (``random_prob``) or kept.

    Args:
      rng: PRNG key.
      input_ids: ``[batch, seq_len]`` int32.
      maskable: ``[batch, seq_len]`` bool, e.g. :func:`maskable_word_pieces`.
      masking: rates and ids.

    Returns:
      :class:`MaskedTokens` with ``P = min(max_predictions, seq_len)`` slots.
    """
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
    """Replaces the entity token (position :data:`ENTITY_POSITION`) by ``[MASK]`` with
    probability ``entity_mask_rate`` per example (always ``[MASK]``: no 80/10/10 rule for
    entities, our reading of the paper's "masking and predicting this token").

    Args:
      rng: PRNG key.
      input_ids: ``[batch, seq_len]`` int32 DocEnt-Full inputs.

    Returns:
      ``(input_ids, labels, weights)``: corrupted ``[batch, seq_len]`` int32 ids, ``[batch]``
      int32 union-vocabulary ids of the entity tokens, ``[batch]`` float32 1 where the
      entity is masked (rows without an entity token, e.g. padding rows, never are).
    """
    input_ids = jnp.asarray(input_ids)
    labels = input_ids[:, ENTITY_POSITION]
    draw = jax.random.uniform(rng, labels.shape) < masking.entity_mask_rate
    masked = draw & (labels >= masking.word_vocab_size)
    column = jnp.where(masked, masking.mask_token_id, labels).astype(input_ids.dtype)
    return (input_ids.at[:, ENTITY_POSITION].set(column), labels.astype(jnp.int32),
            masked.astype(jnp.float32))
