"""DocEnt-Dual: an entity table and a BERT sentence encoder scored by scaled cosine.

DocEnt-Dual (Zemlyanskiy et al., EACL 2021, sec. 3.1) is RELIC (Ling et al. 2020, "Learning
Cross-Context Entity Representations from Text") trained on all sentences of an entity's
documents: an entity e has a free vector ``g(e)`` (a row of a table), a sentence s is
encoded by BERT as ``f(s)`` (its [CLS] state, optionally through a linear projection), and

    score(e, s) = a * cos(g(e), f(s)),      P(e | s) = softmax_e score(e, s)

over in-batch entities or the whole table (``docent_jax.loss``). The DocEnt seed gives the
plain cosine; RELIC multiplies it by a *learned* scalar a (our recollection of Ling et al.
2020, sec. 3, not checked against the paper here: "our reading"). ``learn_scale`` chooses
learned (default, RELIC) or fixed; a starts at ``scale_init`` (our choice, 20) and is
parameterised as ``exp(log_scale)`` so it stays positive.

The table carries the logical axes ``("entities", "embed")``; the project's rules shard its
rows over the ``"model"`` mesh axis, so a table of millions of entities never sits whole
on one device. Its row count is padded to a multiple of ``table_multiple`` (so that any
model-axis size dividing that multiple shards it evenly); padded rows are never targets and
are masked out of the full softmax.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from embedding_core.encoders import EncoderConfig, TransformerEncoder

POOLINGS = ("cls", "mean")
PRETRAINED_PATH = ("transformer",)
"""Where the pretrained BERT weights go in the parameter tree."""
ENTITY_PARAMS = ("entity_embeddings", "log_scale")
"""Top-level parameters of the entity side (optimised with ``entity_learning_rate``)."""


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
        if self.pooling == "mean":
            m = attention_mask.astype(jnp.float32)[..., None]
            pooled = jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
        else:
            pooled = hidden[:, 0]
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


def init_fn(model: DocEntDual):
    """``rng -> boxed params`` for ``model`` on ``[1, 1, 8]`` dummy inputs."""

    def init(rng):
        ids = jnp.zeros((1, 1, 8), jnp.int32)
        return model.init({"params": rng}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))["params"]

    return init
