"""DocEnt's Flax modules: DocEnt-Dual, DocEnt-Full and DocEnt-Hybrid (``docs/docent.md``).

**DocEnt-Dual** (Zemlyanskiy et al., EACL 2021, sec. 3.1) is RELIC (Ling et al. 2020,
"Learning Cross-Context Entity Representations from Text") trained on all sentences of an
entity's documents: an entity e has a free vector ``g(e)`` (a row of a table), a sentence s
is encoded by BERT as ``f(s)`` (its [CLS] state, or the mean over its tokens, optionally
through a linear projection), and

    score(e, s) = a * cos(g(e), f(s)),      P(e | s) = softmax_e score(e, s)

over in-batch entities or the whole table (``docent_jax.loss``). The DocEnt paper gives the
plain cosine; RELIC multiplies it by a *learned* scalar a (our reading of Ling et al. 2020).
``learn_scale`` chooses learned (default, RELIC) or fixed; a starts at ``scale_init`` (our
choice, 20) and is parameterised as ``exp(log_scale)`` so it stays positive.

The table carries the logical axes ``("entities", "embed")``; the project's rules shard its
rows over the ``"model"`` mesh axis, so a table of millions of entities never sits whole
on one device. Its row count is padded to a multiple of ``table_multiple`` (so that any
model-axis size dividing that multiple shards it evenly); padded rows are never targets and
are masked out of the full-vocabulary softmax.

**DocEnt-Full** (sec. 3): BERT whose input vocabulary is extended by one token per entity.
The input is ``[CLS] <entity> [SEP] sentence [SEP]`` (``docent_jax.data.
full_inputs_from_tokens``); word pieces and the entity token are masked and predicted by
one tied MLM head over the union vocabulary. As in the released TF1 patch (google-research
``docent``) the entity rows are a second table of hidden width, concatenated after the
word-piece table, with their own output bias; the pretrained checkpoint loads unchanged
into the word-piece part and entity rows start from a truncated normal (std 0.02).

**DocEnt-Hybrid**: the dual-encoder layout (entity table ``g(e)``, BERT sentence encoder
``f(s)`` on the sentence alone) plus an MLM head whose input for every masked word piece is
``[f(s_-J)_t ; g(e)]``, so entity vectors must help predict their text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docent_jax.configs import POOLINGS
from embedding_core.encoders import EncoderConfig, TransformerEncoder
from embedding_core.inference import masked_mean

PRETRAINED_PATH = ("transformer",)
"""Where the pretrained BERT weights go in every DocEnt model's parameter tree (for
``training.create_sharded_state(pretrained={PRETRAINED_PATH: params})``)."""
ENTITY_PARAMS = ("entity_embeddings", "log_scale")
"""Top-level parameters of the entity side (optimised with ``entity_learning_rate``)."""
ENTITY_INIT_STD = 0.02


def table_rows(num_entities: int, multiple: int) -> int:
    """Rows of the entity table: ``num_entities`` rounded up to a multiple of ``multiple``.

    Raises:
      ValueError: ``num_entities`` or ``multiple`` below 1.
    """
    if num_entities < 1 or multiple < 1:
        raise ValueError(f"num_entities={num_entities} and multiple={multiple} must be >= 1")
    return -(-num_entities // multiple) * multiple


class DocEntDual(nn.Module):
    """RELIC-style dual encoder: entity table ``g`` and sentence encoder ``f``.

    Attributes:
      config: the BERT encoder's config.
      num_entities: real entities (rows ``[0, num_entities)`` of the table).
      num_rows: rows of the table (``>= num_entities``, see :func:`table_rows`).
      projection_dim: 0 = ``f(s)`` is the pooled state (width ``hidden_size``); otherwise a
        linear projection to this width (also the table's width).
      pooling: ``"cls"`` (DocEnt: ``f_CLS``) or ``"mean"`` over real tokens.
      scale_init: initial value of the scale a (> 0).
      learn_scale: learn a (RELIC) or keep it fixed at ``scale_init``.
      entity_init_std: std of the normal initialisation of the table (BERT's 0.02).
    """

    config: EncoderConfig
    num_entities: int
    num_rows: int
    projection_dim: int = 0
    pooling: str = "cls"
    scale_init: float = 20.0
    learn_scale: bool = True
    entity_init_std: float = 0.02

    @property
    def dim(self) -> int:
        """Width of ``f(s)`` and ``g(e)``."""
        return self.projection_dim or self.config.hidden_size

    def setup(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} not in {POOLINGS}")
        if not 1 <= self.num_entities <= self.num_rows:
            raise ValueError(f"need 1 <= num_entities={self.num_entities} <= "
                             f"num_rows={self.num_rows}")
        if self.scale_init <= 0:
            raise ValueError(f"scale_init must be positive, got {self.scale_init}")
        self.transformer = TransformerEncoder(self.config)
        if self.projection_dim:
            self.projection = nn.Dense(
                self.projection_dim, dtype=jnp.float32, param_dtype=jnp.float32,
                kernel_init=nn.with_logical_partitioning(
                    nn.initializers.normal(self.config.initializer_range), ("embed", "mlp")),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)))
        self.entity_embeddings = self.param(
            "entity_embeddings",
            nn.with_logical_partitioning(nn.initializers.normal(self.entity_init_std),
                                         ("entities", "embed")),
            (self.num_rows, self.dim), jnp.float32)
        if self.learn_scale:
            self.log_scale = self.param(
                "log_scale",
                nn.with_logical_partitioning(
                    nn.initializers.constant(math.log(self.scale_init)), ()),
                (), jnp.float32)

    def encode_sentences(self, input_ids: jax.Array, attention_mask: jax.Array,
                         token_type_ids: jax.Array, deterministic: bool = True) -> jax.Array:
        """``f(s)``: ``[n, seq_len]`` int32 token ids -> ``[n, dim]`` float32 (not normalised)."""
        out = self.transformer(input_ids, attention_mask, token_type_ids,
                               deterministic=deterministic)
        hidden = out.last_hidden_state.astype(jnp.float32)
        pooled = masked_mean(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]
        if self.projection_dim:
            pooled = self.projection(pooled)
        return pooled

    def entity_table(self) -> jax.Array:
        """``g``: the whole ``[num_rows, dim]`` float32 table (padding rows included)."""
        return self.entity_embeddings

    def scale(self) -> jax.Array:
        """The scale a, a float32 scalar."""
        if self.learn_scale:
            return jnp.exp(self.log_scale)
        return jnp.asarray(self.scale_init, jnp.float32)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, *, deterministic: bool = True
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Encodes a batch of sentences and returns everything a loss needs.

        Args:
          input_ids, attention_mask, token_type_ids: ``[batch, fields, seq_len]`` int32, as
            ``data_pipelines.pipeline.make_batches`` yields them (one field: the sentence).

        Returns:
          ``(f, g, a)``: sentence vectors ``[batch * fields, dim]`` float32, the table
          ``[num_rows, dim]`` float32 and the scale (float32 scalar).
        """
        b, f, seq = input_ids.shape
        flat = [x.reshape(b * f, seq) for x in (input_ids, attention_mask, token_type_ids)]
        return (self.encode_sentences(*flat, deterministic=deterministic),
                self.entity_table(), self.scale())


def build_model(config, encoder_config: EncoderConfig, num_entities: int) -> DocEntDual:
    """The model a ``configs/*.py`` config describes, for ``num_entities`` entities."""
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0,
                                                attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.get("dropout_impl", "flax"))
    return DocEntDual(
        encoder_config.replace(dtype=config.dtype), num_entities=num_entities,
        num_rows=table_rows(num_entities, config.table_multiple),
        projection_dim=config.projection_dim, pooling=config.pooling,
        scale_init=config.scale_init, learn_scale=config.learn_scale,
        entity_init_std=config.entity_init_std)


# ----------------------------------------------------------------------------- MLM models


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
        if self.pooling not in POOLINGS:
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
        return masked_mean(h, attention_mask), hidden

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


def init_fn(model: DocEntDual | DocEntFull | DocEntHybrid, seq_len: int = 8,
            predictions: int = 2) -> Callable[[jax.Array], Any]:
    """``rng -> boxed params`` of ``model`` on dummy inputs (for ``create_sharded_state``,
    ``training.restore_params`` and the ``Task``'s ``init_params``)."""

    def init(rng):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        positions = jnp.zeros((1, predictions), jnp.int32)
        if isinstance(model, DocEntDual):
            args = (ids[None], jnp.ones_like(ids)[None], ids[None])
        elif isinstance(model, DocEntHybrid):
            args = (ids, jnp.ones_like(ids), ids, jnp.zeros((1,), jnp.int32), positions)
        else:
            args = (ids, jnp.ones_like(ids), ids, positions)
        return model.init({"params": rng}, *args)["params"]

    return init


def entity_table(params: Mapping[str, Any]) -> jax.Array:
    """The learned entity vectors ``[num_entities, hidden]`` of either model's params (for
    export and tag prediction)."""
    return nn.unbox(params["entity_embeddings"])
