"""DocEnt-Full and DocEnt-Hybrid: entity vectors learned by masked language modelling.

Zemlyanskiy et al., "DocEnt: Learning Self-Supervised Entity Representations from Large
Document Collections", EACL 2021 (arXiv 2102.13247), sec. 3; PAPERS.md section 2.

* **DocEnt-Full**: BERT whose input vocabulary is extended by one token per entity. The input
  is ``[CLS] <entity> [SEP] sentence [SEP]`` (segment A = the entity token, token type 0;
  segment B = a sentence about it, token type 1); entity token ``e`` has id
  ``word_vocab_size + e``. Word pieces and the entity token are masked and predicted by one
  tied MLM head over the union vocabulary; loss ``L_MLM + lambda * L_E``. As in the released
  TF1 patch (google-research ``docent``) the entity rows are a second table of hidden width,
  concatenated after the word-piece table, with their own output bias; the pretrained
  checkpoint loads unchanged into the word-piece part and entity rows start from a truncated
  normal (std 0.02).
* **DocEnt-Hybrid**: the dual-encoder layout (entity table ``g(e)``, BERT sentence encoder
  ``f(s)`` on the sentence alone, in-batch softmax over ``scale * cos(f(s), g(e))``) plus an
  MLM head whose input for every masked word piece is ``[f(s_-J)_t ; g(e)]``, so entity
  vectors must help predict their text.

Masking is done in JAX inside the loss from the step's rng (``make_train_step`` passes
``fold_in(rng, step)``): the masks of a step depend only on (seed, step, batch), so a resumed
run draws exactly the masks the uninterrupted run would have, and the data pipeline stays
model-agnostic. ``jax.random`` draws the global array, so the masks do not change with the
mesh either.

Public pieces for a trainer: :class:`MaskingConfig`, :func:`full_inputs_from_tokens`,
:class:`DocEntFull` / :class:`DocEntHybrid`, :func:`init_fn`, :data:`PRETRAINED_PATHS`,
:func:`make_full_loss_fn` / :func:`make_hybrid_loss_fn` (``loss_fn(params, batch, rng) ->
(loss, metrics)`` for ``embedding_core.training.make_train_step``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from embedding_core.encoders import EncoderConfig, TransformerEncoder
from embedding_core.losses import cosine_similarity_matrix, info_nce

LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]

ENTITY_POSITION = 1
"""Index of the entity token in a DocEnt-Full input ``[CLS] <entity> [SEP] sentence [SEP]``."""

PRETRAINED_PATHS: tuple[tuple[str, ...], ...] = (("transformer",),)
"""Where a checkpoint's encoder tree goes in both models' parameters (for
``training.create_sharded_state(pretrained={path: params})``)."""

ENTITY_INIT_STD = 0.02


# ----------------------------------------------------------------------------- masking


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


def full_inputs_from_tokens(
    input_ids: np.ndarray,
    lengths: np.ndarray,
    entity_ids: np.ndarray,
    *,
    word_vocab_size: int,
    sep_id: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """DocEnt-Full inputs ``[CLS] <entity> [SEP] sentence [SEP]`` from tokenised sentences.

    Args:
      input_ids: ``[n, L]`` int32 rows ``[CLS] sentence [SEP] pad...`` (e.g.
        ``data_pipelines.tokenization.tokenize(tokenizer, sentences, L)``).
      lengths: ``[n]`` int32 real tokens per row.
      entity_ids: ``[n]`` int entity index of each sentence, in ``[0, num_entities)``.
      word_vocab_size: entity ``e`` gets token id ``word_vocab_size + e``.
      sep_id, pad_id: ids of ``[SEP]`` and padding.

    Returns:
      ``input_ids``, ``attention_mask``, ``token_type_ids``: ``[n, L + 2]`` int32 (token type
      0 for ``[CLS] <entity> [SEP]``, 1 for the sentence and its final ``[SEP]``, 0 on
      padding); ``entity_ids``: ``[n]`` int32.

    Raises:
      ValueError: shapes disagree or an entity id is negative.
    """
    ids = np.asarray(input_ids)
    lengths = np.asarray(lengths)
    entity_ids = np.asarray(entity_ids)
    if ids.ndim != 2 or lengths.shape != (ids.shape[0],) or entity_ids.shape != lengths.shape:
        raise ValueError(f"input_ids must be [n, L] with lengths and entity_ids [n]; got "
                         f"{ids.shape}, {lengths.shape}, {entity_ids.shape}")
    if entity_ids.size and entity_ids.min() < 0:
        raise ValueError(f"entity ids must be >= 0, got {entity_ids.min()}")
    n, width = ids.shape
    out = np.full((n, width + 2), pad_id, dtype=np.int32)
    out[:, 0] = ids[:, 0]
    out[:, ENTITY_POSITION] = word_vocab_size + entity_ids
    out[:, 2] = sep_id
    out[:, 3:] = ids[:, 1:]
    positions = np.arange(width + 2)[None, :]
    mask = positions < (lengths[:, None] + 2)
    types = (positions >= 3) & mask
    return {"input_ids": out, "attention_mask": mask.astype(np.int32),
            "token_type_ids": types.astype(np.int32), "entity_ids": entity_ids.astype(np.int32)}


# ----------------------------------------------------------------------------- modules


def _entity_table_init() -> nn.initializers.Initializer:
    # TF1 BERT's truncated_normal_initializer(0.02): std of the untruncated normal, cut at 2σ.
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(ENTITY_INIT_STD),
                                        ("entities", "embed"))


class MLMHeadTransform(nn.Module):
    """Dense -> GELU (exact) -> LayerNorm, in float32 (HF ``BertPredictionHeadTransform``).

    Input ``[..., d_in]``; output ``[..., features]`` float32. Parameters are always freshly
    initialised here: the MiniLM checkpoint ships no MLM head (no ``cls.*`` tensors).
    """

    features: int
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(
            self.features, dtype=jnp.float32, param_dtype=jnp.float32,
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.normal(self.initializer_range), (None, "embed")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
            name="dense")(x.astype(jnp.float32))
        x = jax.nn.gelu(x, approximate=False)
        return nn.LayerNorm(
            epsilon=self.layer_norm_eps, dtype=jnp.float32, param_dtype=jnp.float32,
            use_fast_variance=False,
            scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
            name="LayerNorm")(x)


def _gather(hidden: jax.Array, positions: jax.Array) -> jax.Array:
    """``[batch, seq_len, h]``, ``[batch, P]`` -> ``[batch, P, h]``."""
    return jnp.take_along_axis(hidden, positions[..., None], axis=1)


def _zeros(module: nn.Module, name: str, axis: str, size: int) -> jax.Array:
    """A float32 ``[size]`` parameter of zeros with logical axis ``axis`` (output biases)."""
    init = nn.with_logical_partitioning(nn.initializers.zeros_init(), (axis,))
    return module.param(name, init, (size,), jnp.float32)


def _word_table(transformer: TransformerEncoder) -> jax.Array:
    """The encoder's word-piece table ``[vocab, hidden]`` (the encoder must have run)."""
    return nn.unbox(transformer.variables["params"]["embeddings"]["word_embeddings"]["embedding"])


class DocEntFull(nn.Module):
    """BERT with one extra input token per entity and a tied MLM head over the union.

    Parameters: ``transformer`` (the checkpoint's encoder tree, unchanged),
    ``entity_embeddings`` ``[num_entities, hidden]`` (logical ``("entities", "embed")``,
    truncated normal std 0.02), ``mlm_transform`` (fresh: MiniLM ships no MLM head),
    ``word_bias`` ``[vocab]`` and ``entity_bias`` ``[num_entities]`` (zeros).

    Call: ``(input_ids, attention_mask, token_type_ids, positions)`` with ``[batch, seq_len]``
    int32 inputs (entity ``e`` = id ``vocab_size + e``) and ``[batch, P]`` int32 positions to
    predict; returns ``[batch, P, vocab_size + num_entities]`` float32 logits. Only the ``P``
    gathered positions get logits (BERT's ``max_predictions_per_seq`` gather); both tables
    and biases carry the logical names ``"vocab"`` / ``"entities"``, so with the default rules
    the logits are sharded over the mesh's ``"model"`` axis instead of living on one device.

    Raises:
      ValueError: ``num_entities < 1`` (at init).
    """

    config: EncoderConfig
    num_entities: int

    def setup(self):
        if self.num_entities < 1:
            raise ValueError(f"num_entities must be >= 1, got {self.num_entities}")
        cfg = self.config
        self.transformer = TransformerEncoder(cfg)
        self.entity_embeddings = self.param("entity_embeddings", _entity_table_init(),
                                            (self.num_entities, cfg.hidden_size), jnp.float32)
        self.mlm_transform = MLMHeadTransform(cfg.hidden_size, cfg.layer_norm_eps,
                                              cfg.initializer_range)
        self.word_bias = _zeros(self, "word_bias", "vocab", cfg.vocab_size)
        self.entity_bias = _zeros(self, "entity_bias", "entities", self.num_entities)

    def encode(self, input_ids, attention_mask, token_type_ids, *, deterministic=True,
               output_hidden_states=False):
        """The encoder on an input that may hold entity tokens: :class:`EncoderOutput`."""
        return self.transformer(input_ids, attention_mask, token_type_ids,
                                deterministic=deterministic,
                                output_hidden_states=output_hidden_states,
                                extra_token_embeddings=self.entity_embeddings)

    def word_table(self) -> jax.Array:
        """The encoder's word-piece table ``[vocab, hidden]`` (call after :meth:`encode`)."""
        return _word_table(self.transformer)

    def mlm_logits(self, hidden: jax.Array) -> jax.Array:
        """Tied head: ``t = LN(gelu(h W + b))``, ``logits = t [E_word; E_ent]^T + [b_w; b_e]``.

        Input ``[..., hidden]``; output ``[..., vocab + num_entities]`` float32.
        """
        t = self.mlm_transform(hidden)
        hp = jax.lax.Precision.HIGHEST
        words = jnp.einsum("...h,vh->...v", t, self.word_table(), precision=hp) + self.word_bias
        entities = jnp.einsum("...h,eh->...e", t, self.entity_embeddings.astype(jnp.float32),
                              precision=hp) + self.entity_bias
        return jnp.concatenate([words, entities], axis=-1)

    def __call__(self, input_ids, attention_mask, token_type_ids, positions, *,
                 deterministic=True):
        hidden = self.encode(input_ids, attention_mask, token_type_ids,
                             deterministic=deterministic).last_hidden_state
        return self.mlm_logits(_gather(hidden, positions))


class DocEntHybrid(nn.Module):
    """Dual encoder (entity table + sentence encoder) with an entity-conditioned MLM head.

    Parameters: ``transformer`` (checkpoint tree, unchanged), ``entity_embeddings``
    ``[num_entities, hidden]`` (the dual encoder's ``g(e)``; truncated normal std 0.02),
    ``mlm_transform`` (dense ``2 * hidden -> hidden``, fresh), ``word_bias`` ``[vocab]``.

    Call: ``(input_ids, attention_mask, token_type_ids, entity_ids, positions)`` with the
    sentence alone (``[CLS] s [SEP]``, ``[batch, seq_len]`` int32), ``[batch]`` int32 entity
    ids and ``[batch, P]`` int32 positions to predict. Returns ``(f(s), g(e), logits)``:
    ``[batch, hidden]``, ``[batch, hidden]`` and ``[batch, P, vocab]``, all float32.
    ``pooling``: ``"cls"`` (the paper's ``f_CLS``) or ``"mean"`` (over real tokens).

    Raises:
      ValueError: ``num_entities < 1`` or an unknown ``pooling`` (at init).
    """

    config: EncoderConfig
    num_entities: int
    pooling: str = "cls"

    def setup(self):
        if self.num_entities < 1:
            raise ValueError(f"num_entities must be >= 1, got {self.num_entities}")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
        cfg = self.config
        self.transformer = TransformerEncoder(cfg)
        self.entity_embeddings = self.param("entity_embeddings", _entity_table_init(),
                                            (self.num_entities, cfg.hidden_size), jnp.float32)
        self.mlm_transform = MLMHeadTransform(cfg.hidden_size, cfg.layer_norm_eps,
                                              cfg.initializer_range)
        self.word_bias = _zeros(self, "word_bias", "vocab", cfg.vocab_size)

    def encode_sentences(self, input_ids, attention_mask, token_type_ids, *,
                         deterministic=True) -> tuple[jax.Array, jax.Array]:
        """``(f(s) [batch, hidden] float32, token states [batch, seq_len, hidden])``."""
        hidden = self.transformer(input_ids, attention_mask, token_type_ids,
                                  deterministic=deterministic).last_hidden_state
        h = hidden.astype(jnp.float32)
        if self.pooling == "cls":
            return h[:, 0], hidden
        m = attention_mask.astype(jnp.float32)[..., None]
        return jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0), hidden

    def entity_vectors(self, entity_ids: jax.Array) -> jax.Array:
        """``g(e)``: ``[batch]`` int32 -> ``[batch, hidden]`` float32."""
        return jnp.take(self.entity_embeddings, entity_ids, axis=0).astype(jnp.float32)

    def mlm_logits(self, hidden: jax.Array, entity_vectors: jax.Array) -> jax.Array:
        """``LN(gelu([h_t ; g(e)] W + b)) E_word^T + b_w``: ``[batch, P, hidden]`` states and
        ``[batch, hidden]`` entity vectors -> ``[batch, P, vocab]`` float32 (call after the
        encoder has run)."""
        g = jnp.broadcast_to(entity_vectors[:, None, :], hidden.shape[:-1] + (
            entity_vectors.shape[-1],))
        t = self.mlm_transform(jnp.concatenate([hidden.astype(jnp.float32), g], axis=-1))
        return jnp.einsum("...h,vh->...v", t, _word_table(self.transformer),
                          precision=jax.lax.Precision.HIGHEST) + self.word_bias

    def __call__(self, input_ids, attention_mask, token_type_ids, entity_ids, positions, *,
                 deterministic=True):
        sentence, hidden = self.encode_sentences(input_ids, attention_mask, token_type_ids,
                                                 deterministic=deterministic)
        entity = self.entity_vectors(entity_ids)
        return sentence, entity, self.mlm_logits(_gather(hidden, positions), entity)


def init_fn(model: DocEntFull | DocEntHybrid, seq_len: int = 8,
            predictions: int = 2) -> Callable[[jax.Array], Any]:
    """``rng -> boxed params`` of ``model`` on dummy inputs (for ``create_sharded_state``)."""

    def init(rng):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        positions = jnp.zeros((1, predictions), jnp.int32)
        if isinstance(model, DocEntHybrid):
            args = (ids, jnp.ones_like(ids), ids, jnp.zeros((1,), jnp.int32), positions)
        else:
            args = (ids, jnp.ones_like(ids), ids, positions)
        return model.init({"params": rng}, *args)["params"]

    return init


# ----------------------------------------------------------------------------- losses


def _cross_entropy_sums(logits: jax.Array, labels: jax.Array,
                        weights: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sums of weighted cross-entropy and of correct top-1 predictions, and the weight sum."""
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights), jnp.sum(weights)


def _mean(total: jax.Array, count: jax.Array) -> jax.Array:
    return total / jnp.maximum(count, 1.0)


def full_loss(
    model: DocEntFull,
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    masking: MaskingConfig,
    *,
    entity_loss_weight: float = 1.0,
    single_cross_entropy: bool = False,
    dropout: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DocEnt-Full loss ``L_MLM + lambda * L_E`` (paper sec. 3, "DocEnt-Full").

    ``L_MLM`` is the mean cross-entropy of the masked word pieces and ``L_E`` that of the
    masked entity tokens, both with softmax over the union vocabulary (word pieces and
    entities), in float32. ``single_cross_entropy=True`` instead averages all masked tokens
    together, ``(sum_words + lambda * sum_entities) / (n_words + n_entities)``: what the
    released TF1 code did in effect (one MLM loss over the union); the two agree up to the
    weighting of the terms.

    Args:
      batch: ``input_ids``, ``attention_mask``, ``token_type_ids``: ``[batch, seq_len]`` int32
        in the :func:`full_inputs_from_tokens` layout.
      rng: the step key; split into masking and dropout keys.
      masking: rates and ids; ``entity_loss_weight`` is lambda.
      dropout: apply the encoder's dropout.

    Returns:
      ``(loss, metrics)``: float32 scalar and ``mlm_loss``, ``entity_loss``, ``mlm_accuracy``,
      ``entity_accuracy``, ``masked_words``, ``masked_entities`` (counts in the batch).
    """
    mask_rng, entity_rng, dropout_rng = jax.random.split(rng, 3)
    ids, mask, types = (jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                         "token_type_ids"))
    words = mask_word_pieces(mask_rng, ids, maskable_word_pieces(ids, mask, masking), masking)
    corrupted, entity_labels, entity_weights = mask_entity_tokens(entity_rng, words.input_ids,
                                                                  masking)
    positions = jnp.concatenate(
        [words.positions, jnp.full((ids.shape[0], 1), ENTITY_POSITION, jnp.int32)], axis=1)
    logits = model.apply({"params": params}, corrupted, mask, types, positions,
                         deterministic=not dropout, rngs={"dropout": dropout_rng})
    w_loss, w_correct, w_count = _cross_entropy_sums(logits[:, :-1], words.labels, words.weights)
    e_loss, e_correct, e_count = _cross_entropy_sums(logits[:, -1], entity_labels,
                                                     entity_weights)
    mlm, entity = _mean(w_loss, w_count), _mean(e_loss, e_count)
    if single_cross_entropy:
        loss = (w_loss + entity_loss_weight * e_loss) / jnp.maximum(w_count + e_count, 1.0)
    else:
        loss = mlm + entity_loss_weight * entity
    metrics = {"mlm_loss": mlm, "entity_loss": entity,
               "mlm_accuracy": _mean(w_correct, w_count),
               "entity_accuracy": _mean(e_correct, e_count),
               "masked_words": w_count, "masked_entities": e_count}
    return loss, metrics


def hybrid_loss(
    model: DocEntHybrid,
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    masking: MaskingConfig,
    *,
    scale: float = 20.0,
    mlm_weight: float = 1.0,
    dropout: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DocEnt-Hybrid loss: in-batch dual-encoder softmax + entity-conditioned MLM.

    ``L_dual = mean_i -log softmax_j(scale * cos(f(s_i), g(e_j)))_i`` over the global
    batch's entities (``embedding_core.losses.info_nce`` with temperature ``1 / scale``);
    another sentence of the same entity is not a negative (``key_ids = entity_ids``).
    ``L_MLM`` is the mean cross-entropy of the masked word pieces predicted from
    ``[f(s_-J)_t ; g(e)]``. Loss ``L_dual + mlm_weight * L_MLM``.

    One encoder pass on the masked sentence serves both terms (its ``f_CLS`` is the dual
    encoder's sentence vector): our reading; the paper does not say whether ``f(s)`` of the
    dual term sees the masked or the clean sentence.

    Args:
      batch: ``input_ids``, ``attention_mask``, ``token_type_ids`` ``[batch, seq_len]`` int32
        (the sentence alone) and ``entity_ids`` ``[batch]`` int32.
      rng: the step key; split into masking and dropout keys.

    Returns:
      ``(loss, metrics)``: ``dual_loss``, ``dual_accuracy`` (the sentence's own entity scores
      highest among the batch's other entities), ``mlm_loss``, ``mlm_accuracy``,
      ``masked_words``.
    """
    mask_rng, dropout_rng = jax.random.split(rng)
    ids, mask, types = (jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                         "token_type_ids"))
    entity_ids = jnp.asarray(batch["entity_ids"], jnp.int32)
    words = mask_word_pieces(mask_rng, ids, maskable_word_pieces(ids, mask, masking), masking)
    sentence, entity, logits = model.apply(
        {"params": params}, words.input_ids, mask, types, entity_ids, words.positions,
        deterministic=not dropout, rngs={"dropout": dropout_rng})
    n = sentence.shape[0]
    index = jnp.arange(n, dtype=jnp.int32)
    dual = jnp.mean(info_nce(sentence, entity, index, temperature=1.0 / scale,
                             key_ids=entity_ids))
    cos = cosine_similarity_matrix(sentence, entity)
    others = entity_ids[None, :] != entity_ids[:, None]
    best_other = jnp.max(jnp.where(others, cos, -jnp.inf), axis=1)
    dual_accuracy = jnp.mean((cos[index, index] > best_other).astype(jnp.float32))
    w_loss, w_correct, w_count = _cross_entropy_sums(logits, words.labels, words.weights)
    mlm = _mean(w_loss, w_count)
    metrics = {"dual_loss": dual, "dual_accuracy": dual_accuracy, "mlm_loss": mlm,
               "mlm_accuracy": _mean(w_correct, w_count), "masked_words": w_count}
    return dual + mlm_weight * mlm, metrics


def make_full_loss_fn(model: DocEntFull, masking: MaskingConfig, **options: Any) -> LossFn:
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` of :func:`full_loss`."""

    def loss_fn(params, batch, rng):
        return full_loss(model, params, batch, rng, masking, **options)

    return loss_fn


def make_hybrid_loss_fn(model: DocEntHybrid, masking: MaskingConfig, **options: Any) -> LossFn:
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` of :func:`hybrid_loss`."""

    def loss_fn(params, batch, rng):
        return hybrid_loss(model, params, batch, rng, masking, **options)

    return loss_fn


def entity_table(params: Mapping[str, Any]) -> jax.Array:
    """The learned entity vectors ``[num_entities, hidden]`` of either model's params (for
    export and tag prediction)."""
    return nn.unbox(params["entity_embeddings"])
