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
from embedding_core.losses import cosine_similarity_matrix

PRETRAINED_PATH = ("transformer",)
"""Where the pretrained BERT weights go in every DocEnt model's parameter tree (for
``training.create_sharded_state(pretrained={PRETRAINED_PATH: params})``)."""
ENTITY_PARAMS = ("entity_embeddings", "entity_bias", "log_scale")
"""Top-level parameters of the entity side (optimised with ``entity_learning_rate``)."""
MLM_HEAD_PARAMS = ("mlm_transform", "word_bias", "entity_bias")
"""Top-level parameters of the fresh MLM head (the only ones trained in a head warm-up)."""
VARIANTS = ("dual", "full", "hybrid")
ENTITY_INIT_STD = 0.02


def dual_scores(queries: jax.Array, table: jax.Array, scale: jax.Array | float) -> jax.Array:
    """DocEnt-Dual's (and Hybrid's) ``a * cos(q, g(e))``: ``[n, dim]`` queries and
    ``[rows, dim]`` table rows -> ``[n, rows]`` float32 (sec. 3.1; ``docs/docent.md``)."""
    return scale * cosine_similarity_matrix(queries.astype(jnp.float32), table)


def full_scores(t: jax.Array, table: jax.Array, bias: jax.Array) -> jax.Array:
    """DocEnt-Full's entity logits ``t . g(e) + b_e``: ``[..., hidden]`` head outputs,
    ``[rows, hidden]`` entity rows and ``[rows]`` biases -> ``[..., rows]`` float32."""
    return jnp.einsum("...h,eh->...e", t.astype(jnp.float32), table.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST) + bias


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

    def encode_tokens(self, input_ids: jax.Array, attention_mask: jax.Array,
                      token_type_ids: jax.Array, deterministic: bool = True
                      ) -> tuple[jax.Array, jax.Array]:
        """``(f(s) [n, dim] float32, token states [n, seq_len, hidden])`` of ``[n, seq_len]``
        int32 inputs (the states in the encoder's compute dtype)."""
        out = self.transformer(input_ids, attention_mask, token_type_ids,
                               deterministic=deterministic)
        hidden = out.last_hidden_state.astype(jnp.float32)
        pooled = masked_mean(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]
        if self.projection_dim:
            pooled = self.projection(pooled)
        return pooled, out.last_hidden_state

    def encode_sentences(self, input_ids: jax.Array, attention_mask: jax.Array,
                         token_type_ids: jax.Array, deterministic: bool = True) -> jax.Array:
        """``f(s)``: ``[n, seq_len]`` int32 token ids -> ``[n, dim]`` float32 (not normalised)."""
        return self.encode_tokens(input_ids, attention_mask, token_type_ids, deterministic)[0]

    def entity_scores(self, queries: jax.Array) -> jax.Array:
        """``a * cos(q, g(e))`` for every table row: ``[n, dim]`` -> ``[n, num_rows]`` float32
        (the logits of P(e | q); rows at or beyond ``num_entities`` are padding)."""
        return dual_scores(queries, self.entity_table(), self.scale())

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


# ----------------------------------------------------------------------------- MLM models


def _entity_table_init() -> nn.initializers.Initializer:
    # TF1 BERT's truncated_normal_initializer(0.02): std of the untruncated normal, cut at 2σ.
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(ENTITY_INIT_STD),
                                        ("entities", "embed"))


class MLMHeadTransform(nn.Module):
    """Dense -> GELU (exact) -> LayerNorm, in float32 (HF ``BertPredictionHeadTransform``).

    Input ``[..., d_in]``; output ``[..., features]`` float32. Parameters are freshly
    initialised (the MiniLM checkpoint ships no MLM head, no ``cls.*`` tensors); see
    ``config.mlm_head_init`` for the optional head-only warm-up.
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


def word_table(params: Mapping[str, Any]) -> jax.Array:
    """The word-piece table ``[vocab, hidden]`` of a Full or Hybrid model's params (the tied
    MLM output matrix)."""
    return nn.unbox(params["transformer"]["embeddings"]["word_embeddings"]["embedding"])


class DocEntFull(nn.Module):
    """BERT with one extra input token per entity and a tied MLM head over the union.

    Parameters: ``transformer`` (the checkpoint's encoder tree, unchanged),
    ``entity_embeddings`` ``[num_rows, hidden]`` (logical ``("entities", "embed")``, sharded
    like DocEnt-Dual's table; truncated normal std 0.02), ``mlm_transform`` (fresh: MiniLM
    ships no MLM head), ``word_bias`` ``[vocab]`` and ``entity_bias`` ``[num_rows]`` (zeros).
    Rows at or beyond ``num_entities`` are padding: never an input token, never a target,
    masked out of every softmax.

    Call: ``(input_ids, attention_mask, token_type_ids, positions)`` with ``[batch, seq_len]``
    int32 inputs (entity ``e`` = id ``vocab_size + e``) and ``[batch, P]`` int32 positions to
    predict; returns the dense ``[batch, P, vocab_size + num_entities]`` float32 logits (for
    tests and small vocabularies). Training never builds them: :meth:`predict` gives the
    head outputs and ``docent_jax.loss.full_loss`` computes the union softmax with the
    entity part vocabulary-parallel over the ``"model"`` axis.

    Raises:
      ValueError: ``num_entities < 1`` or ``num_rows < num_entities`` (at init).
    """

    config: EncoderConfig
    num_entities: int
    num_rows: int = 0  # 0 = num_entities (no padding)

    @property
    def rows(self) -> int:
        return self.num_rows or self.num_entities

    @property
    def dim(self) -> int:
        """Width of the entity rows and of the head outputs (the hidden size)."""
        return self.config.hidden_size

    def setup(self):
        if not 1 <= self.num_entities <= self.rows:
            raise ValueError(f"need 1 <= num_entities={self.num_entities} <= "
                             f"num_rows={self.rows}")
        cfg = self.config
        self.transformer = TransformerEncoder(cfg)
        self.entity_embeddings = self.param("entity_embeddings", _entity_table_init(),
                                            (self.rows, cfg.hidden_size), jnp.float32)
        self.mlm_transform = MLMHeadTransform(cfg.hidden_size, cfg.layer_norm_eps,
                                              cfg.initializer_range)
        self.word_bias = _zeros(self, "word_bias", "vocab", cfg.vocab_size)
        self.entity_bias = _zeros(self, "entity_bias", "entities", self.rows)

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

    def predict(self, input_ids, attention_mask, token_type_ids, positions, *,
                deterministic=True) -> jax.Array:
        """Head outputs ``t = LN(gelu(h W + b))`` at ``positions``: ``[batch, P, hidden]``
        float32 (the logits of token v are ``t . E_v + b_v``)."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids,
                             deterministic=deterministic).last_hidden_state
        return self.mlm_transform(_gather(hidden, positions))

    def entity_scores(self, t: jax.Array) -> jax.Array:
        """Entity logits ``t E_ent^T + b_ent``: ``[..., hidden]`` -> ``[..., num_rows]``
        float32 (padding rows included; mask them)."""
        return full_scores(t, self.entity_embeddings, self.entity_bias)

    def mlm_logits(self, hidden: jax.Array) -> jax.Array:
        """Tied head: ``t = LN(gelu(h W + b))``, ``logits = t [E_word; E_ent]^T + [b_w; b_e]``.

        Input ``[..., hidden]``; output ``[..., vocab + num_entities]`` float32 (real
        entities only). Call after the encoder has run.
        """
        t = self.mlm_transform(hidden)
        words = jnp.einsum("...h,vh->...v", t, self.word_table(),
                           precision=jax.lax.Precision.HIGHEST) + self.word_bias
        entities = self.entity_scores(t)[..., :self.num_entities]
        return jnp.concatenate([words, entities], axis=-1)

    def __call__(self, input_ids, attention_mask, token_type_ids, positions, *,
                 deterministic=True):
        hidden = self.encode(input_ids, attention_mask, token_type_ids,
                             deterministic=deterministic).last_hidden_state
        return self.mlm_logits(_gather(hidden, positions))


class DocEntHybrid(DocEntDual):
    """DocEnt-Dual (entity table ``g``, sentence encoder ``f``, learned scale) plus an MLM
    head whose input for every masked word piece is ``[f(s_-J)_t ; g(e)]``, so entity vectors
    must help predict their text.

    Extra parameters over :class:`DocEntDual`: ``mlm_transform`` (dense
    ``hidden + dim -> hidden``, fresh) and ``word_bias`` ``[vocab]`` (zeros); the output
    matrix is the encoder's word-piece table (tied).

    Call: ``(input_ids, attention_mask, token_type_ids, entity_ids, positions)`` with the
    (masked) sentence alone (``[CLS] s [SEP]``, ``[batch, seq_len]`` int32), ``[batch]``
    int32 entity ids and ``[batch, P]`` int32 positions to predict; ``clean_ids`` (the
    unmasked sentence) gives the dual term its own encoder pass. Returns ``(f(s), logits,
    table, a)``: ``[batch, dim]`` (of the clean sentence when given, else of the masked
    one), ``[batch, P, vocab]``, the ``[num_rows, dim]`` table and the scale, all float32.
    """

    def setup(self):
        super().setup()
        cfg = self.config
        self.mlm_transform = MLMHeadTransform(cfg.hidden_size, cfg.layer_norm_eps,
                                              cfg.initializer_range)
        self.word_bias = _zeros(self, "word_bias", "vocab", cfg.vocab_size)

    def entity_vectors(self, entity_ids: jax.Array) -> jax.Array:
        """``g(e)``: ``[batch]`` int32 -> ``[batch, dim]`` float32."""
        return jnp.take(self.entity_embeddings, entity_ids, axis=0).astype(jnp.float32)

    def mlm_logits(self, hidden: jax.Array, entity_vectors: jax.Array) -> jax.Array:
        """``LN(gelu([h_t ; g(e)] W + b)) E_word^T + b_w``: ``[batch, P, hidden]`` states and
        ``[batch, dim]`` entity vectors -> ``[batch, P, vocab]`` float32 (call after the
        encoder has run)."""
        g = jnp.broadcast_to(entity_vectors[:, None, :], hidden.shape[:-1] + (
            entity_vectors.shape[-1],))
        t = self.mlm_transform(jnp.concatenate([hidden.astype(jnp.float32), g], axis=-1))
        return jnp.einsum("...h,vh->...v", t, _word_table(self.transformer),
                          precision=jax.lax.Precision.HIGHEST) + self.word_bias

    def __call__(self, input_ids, attention_mask, token_type_ids, entity_ids, positions, *,
                 clean_ids=None, deterministic=True):
        sentence, hidden = self.encode_tokens(input_ids, attention_mask, token_type_ids,
                                              deterministic=deterministic)
        if clean_ids is not None:
            sentence = self.encode_sentences(clean_ids, attention_mask, token_type_ids,
                                             deterministic=deterministic)
        logits = self.mlm_logits(_gather(hidden, positions), self.entity_vectors(entity_ids))
        return sentence, logits, self.entity_table(), self.scale()


def build_model(config, encoder_config: EncoderConfig, num_entities: int
                ) -> DocEntDual | DocEntFull | DocEntHybrid:
    """The model a ``configs/*.py`` config describes (``config.variant``), for
    ``num_entities`` entities; the table has :func:`table_rows` rows in every variant.

    Raises:
      ValueError: an unknown variant.
    """
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0,
                                                attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.get("dropout_impl", "flax"),
                                            dtype=config.dtype)
    rows = table_rows(num_entities, config.table_multiple)
    variant = config.get("variant", "dual")
    if variant == "full":
        return DocEntFull(encoder_config, num_entities=num_entities, num_rows=rows)
    dual = dict(num_entities=num_entities, num_rows=rows, projection_dim=config.projection_dim,
                pooling=config.pooling, scale_init=config.scale_init,
                learn_scale=config.learn_scale, entity_init_std=config.entity_init_std)
    if variant == "hybrid":
        return DocEntHybrid(encoder_config, **dual)
    if variant != "dual":
        raise ValueError(f"config.variant={variant!r}: use one of {VARIANTS}")
    return DocEntDual(encoder_config, **dual)


def init_fn(model: DocEntDual | DocEntFull | DocEntHybrid, seq_len: int = 8,
            predictions: int = 2) -> Callable[[jax.Array], Any]:
    """``rng -> boxed params`` of ``model`` on dummy inputs (for ``create_sharded_state``,
    ``training.restore_params`` and the ``Task``'s ``init_params``)."""

    def init(rng):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        positions = jnp.zeros((1, predictions), jnp.int32)
        if isinstance(model, DocEntHybrid):
            args = (ids, jnp.ones_like(ids), ids, jnp.zeros((1,), jnp.int32), positions)
        elif isinstance(model, DocEntDual):
            args = (ids[None], jnp.ones_like(ids)[None], ids[None])
        else:
            args = (ids, jnp.ones_like(ids), ids, positions)
        return model.init({"params": rng}, *args)["params"]

    return init


def entity_table(params: Mapping[str, Any], num_entities: int | None = None) -> jax.Array:
    """The learned entity vectors of any variant's params: ``[num_entities, dim]`` (all
    rows, padding included, when ``num_entities`` is None)."""
    table = nn.unbox(params["entity_embeddings"])
    return table if num_entities is None else table[:num_entities]
