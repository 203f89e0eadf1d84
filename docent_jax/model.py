"""DocEnt's Flax modules, Dual, Full and Hybrid (``docs/docent.md``, "Dual encoder
implementation", "Full and Hybrid implementation")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from docent_jax.configs import POOLINGS
from embedding_core import EncoderConfig, TransformerEncoder, masked_mean
from embedding_core.losses.losses import cosine_similarity_matrix

PRETRAINED_PATH = ("transformer",)  # the pretrained BERT's place in every params tree
ENTITY_PARAMS = ("entity_embeddings", "entity_bias", "log_scale")  # entity_learning_rate
MLM_HEAD_PARAMS = ("mlm_transform", "word_bias", "entity_bias")  # trained in a head warm-up
NAMES = {"dual": "DocEnt-Dual", "full": "DocEnt-Full", "hybrid": "DocEnt-Hybrid"}
ENTITY_INIT_STD = 0.02


def dual_scores(queries: jax.Array, table: jax.Array, scale: jax.Array | float) -> jax.Array:
    """``a * cos(q, g(e))``: ``[n, dim]``, ``[rows, dim]`` -> ``[n, rows]`` float32."""
    return scale * cosine_similarity_matrix(queries.astype(jnp.float32), table)


def full_scores(t: jax.Array, table: jax.Array, bias: jax.Array) -> jax.Array:
    """``t . g(e) + b_e``: ``[..., hidden]``, ``[rows, hidden]``, ``[rows]`` -> ``[..., rows]``."""
    return jnp.einsum("...h,eh->...e", t.astype(jnp.float32), table.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST) + bias


def table_rows(num_entities: int, multiple: int) -> int:
    """``num_entities`` rounded up to a multiple of ``multiple`` (ValueError below 1)."""
    if num_entities < 1 or multiple < 1:
        raise ValueError(f"num_entities={num_entities} and multiple={multiple} must be >= 1")
    return -(-num_entities // multiple) * multiple


class DocEntDual(nn.Module):
    """RELIC-style dual encoder: table ``g`` ``[num_rows, dim]`` (padded past ``num_entities``),
    sentence encoder ``f`` (``pooling``, then a projection to ``projection_dim`` when > 0)."""

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
        """``(f(s) [n, dim] float32, states [n, seq_len, hidden] in the compute dtype)``."""
        out = self.transformer(input_ids, attention_mask, token_type_ids,
                               deterministic=deterministic)
        hidden = out.last_hidden_state.astype(jnp.float32)
        pooled = masked_mean(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]
        if self.projection_dim:
            pooled = self.projection(pooled)
        return pooled, out.last_hidden_state

    def encode_sentences(self, input_ids: jax.Array, attention_mask: jax.Array,
                         token_type_ids: jax.Array, deterministic: bool = True) -> jax.Array:
        """``f(s)``: ``[n, seq_len]`` int32 -> ``[n, dim]`` float32 (raw)."""
        return self.encode_tokens(input_ids, attention_mask, token_type_ids, deterministic)[0]

    def entity_scores(self, queries: jax.Array) -> jax.Array:
        """Logits of P(e | q) for every row: ``[n, dim]`` -> ``[n, num_rows]`` float32."""
        return dual_scores(queries, self.entity_table(), self.scale())

    def entity_table(self) -> jax.Array:
        return self.entity_embeddings

    def scale(self) -> jax.Array:
        if self.learn_scale:
            return jnp.exp(self.log_scale)
        return jnp.asarray(self.scale_init, jnp.float32)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, *, deterministic: bool = True
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``[batch, fields, seq]`` int32 -> ``(f [batch * fields, dim], g [num_rows, dim], a)``."""
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
    """Dense -> exact GELU -> LayerNorm in float32 (``BertPredictionHeadTransform``), fresh."""

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
    init = nn.with_logical_partitioning(nn.initializers.zeros_init(), (axis,))
    return module.param(name, init, (size,), jnp.float32)


def _word_table(transformer: TransformerEncoder) -> jax.Array:
    return nn.unbox(transformer.variables["params"]["embeddings"]["word_embeddings"]["embedding"])


def word_table(params: Mapping[str, Any]) -> jax.Array:
    """The word-piece table ``[vocab, hidden]`` of params (the tied MLM output matrix)."""
    return nn.unbox(params["transformer"]["embeddings"]["word_embeddings"]["embedding"])


class DocEntFull(nn.Module):
    """BERT with one input token per entity (id ``vocab_size + e``) and a tied MLM head over
    ``[words; entities]`` (dense logits: tests only); ValueError: bad row counts."""

    config: EncoderConfig
    num_entities: int
    num_rows: int = 0  # 0 = num_entities (no padding)

    @property
    def rows(self) -> int:
        return self.num_rows or self.num_entities

    @property
    def dim(self) -> int:
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
        return self.transformer(input_ids, attention_mask, token_type_ids,
                                deterministic=deterministic,
                                output_hidden_states=output_hidden_states,
                                extra_token_embeddings=self.entity_embeddings)

    def word_table(self) -> jax.Array:
        return _word_table(self.transformer)

    def predict(self, input_ids, attention_mask, token_type_ids, positions, *,
                deterministic=True) -> jax.Array:
        """``t = LN(gelu(h W + b))`` at ``positions``: ``[batch, P, hidden]`` float32."""
        hidden = self.encode(input_ids, attention_mask, token_type_ids,
                             deterministic=deterministic).last_hidden_state
        return self.mlm_transform(_gather(hidden, positions))

    def entity_scores(self, t: jax.Array) -> jax.Array:
        """``t E_ent^T + b_ent``: ``[..., hidden]`` -> ``[..., num_rows]`` float32."""
        return full_scores(t, self.entity_embeddings, self.entity_bias)

    def mlm_logits(self, hidden: jax.Array) -> jax.Array:
        """``t [E_word; E_ent]^T + [b_w; b_e]``: ``[..., vocab + num_entities]`` float32."""
        t = self.mlm_transform(hidden)
        words = jnp.einsum("...h,vh->...v", t, self.word_table(),
                           precision=jax.lax.Precision.HIGHEST) + self.word_bias
        entities = self.entity_scores(t)[..., :self.num_entities]
        return jnp.concatenate([words, entities], axis=-1)

    def __call__(self, input_ids, attention_mask, token_type_ids, positions, *, deterministic=True):
        hidden = self.encode(input_ids, attention_mask, token_type_ids,
                             deterministic=deterministic).last_hidden_state
        return self.mlm_logits(_gather(hidden, positions))


class DocEntHybrid(DocEntDual):
    """:class:`DocEntDual` plus an MLM head on ``[f(s_-J)_t ; g(e)]`` -> ``(f(s), logits [batch,
    P, vocab], g, a)`` float32; ``clean_ids``: the dual term's own pass."""

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
        """``LN(gelu([h_t ; g(e)] W + b)) E_word^T + b_w``: ``[batch, P, vocab]`` float32."""
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
    """``config.variant``'s model (ValueError for an unknown variant)."""
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.dropout_impl,
                                            dtype=config.dtype, remat=config.remat)
    rows = table_rows(num_entities, config.table_multiple)
    variant = config.variant
    if variant == "full":
        return DocEntFull(encoder_config, num_entities=num_entities, num_rows=rows)
    dual = dict(num_entities=num_entities, num_rows=rows, projection_dim=config.projection_dim,
                pooling=config.pooling, scale_init=config.scale_init,
                learn_scale=config.learn_scale, entity_init_std=config.entity_init_std)
    if variant == "hybrid":
        return DocEntHybrid(encoder_config, **dual)
    if variant != "dual":
        raise ValueError(f"config.variant={variant!r}: use one of {tuple(NAMES)}")
    return DocEntDual(encoder_config, **dual)


def init_fn(model: DocEntDual | DocEntFull | DocEntHybrid, seq_len: int = 8,
            predictions: int = 2) -> Callable[[jax.Array], Any]:
    """``rng -> boxed params`` of ``model`` on dummy inputs (the Task's ``init_params``)."""

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
    """Any variant's ``[num_entities, dim]`` entity rows (all rows when None)."""
    table = nn.unbox(params["entity_embeddings"])
    return table if num_entities is None else table[:num_entities]
