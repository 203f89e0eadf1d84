"""DualCSE cross and bi encoders and the one-vector SimCSE encoder (``docs/dualcse.md``)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dualcse_jax import tables
from dualcse_jax.configs import ARCHITECTURES, POOLINGS
from embedding_core import EncoderConfig, TransformerEncoder, masked_mean

KINDS = tables.INDICATORS  # ("explicit", "implicit"): r and u


class Pooler(nn.Module):
    """``hidden [b, seq, h]``, ``mask [b, seq]`` -> ``[b, h]`` float32: ``cls``, ``cls_mlp``
    (``tanh(W h_cls + b)``) or ``mean``."""

    kind: str = "cls"

    @nn.compact
    def __call__(self, hidden: jax.Array, mask: jax.Array) -> jax.Array:
        hidden = hidden.astype(jnp.float32)
        if self.kind == "mean":
            return masked_mean(hidden, mask)
        cls = hidden[:, 0]
        if self.kind == "cls":
            return cls
        if self.kind == "cls_mlp":
            dim = hidden.shape[-1]
            dense = nn.Dense(
                dim,
                kernel_init=nn.with_logical_partitioning(
                    nn.initializers.normal(0.02), ("embed", "mlp")),
                bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
                name="mlp",
            )
            return jnp.tanh(dense(cls))
        raise ValueError(f"unknown pooling {self.kind!r}; choose one of {POOLINGS}")


class SentenceEncoder(nn.Module):
    """Transformer + pooler: ``[n, seq]`` int32 ids -> ``[n, hidden]`` float32."""

    config: EncoderConfig
    pooling: str = "cls"

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids, *, deterministic=True):
        out = TransformerEncoder(self.config, name="transformer")(
            input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return Pooler(self.pooling, name="pooler")(out.last_hidden_state, attention_mask)


class DualEncoder(nn.Module):
    """``[batch, fields, seq]`` int32 (``tables.FIELDS[architecture]``) -> ``(r, u)``, each
    ``[batch, sentences, hidden]`` float32; simcse: u is r."""

    config: EncoderConfig
    architecture: str = "cross"
    pooling: str = "cls"

    def setup(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} not in {ARCHITECTURES}")
        if self.architecture == "bi":
            self.explicit_encoder = SentenceEncoder(self.config, self.pooling)
            self.implicit_encoder = SentenceEncoder(self.config, self.pooling)
        else:
            self.encoder = SentenceEncoder(self.config, self.pooling)

    def __call__(self, input_ids, attention_mask, token_type_ids, *, deterministic=True):
        """Each input: one array, or a tuple per ``tables.length_groups`` group."""
        if isinstance(input_ids, (tuple, list)):
            groups = tables.length_groups(self.architecture)
            if len(groups) != len(input_ids):
                raise ValueError(f"{len(input_ids)} input groups; the {self.architecture} "
                                 f"length groups are {groups}")
        else:
            input_ids, attention_mask, token_type_ids = (
                (input_ids,), (attention_mask,), (token_type_ids,))
            groups = (tuple(range(input_ids[0].shape[1])),)
        fields = tables.FIELDS[self.architecture]
        if sum(len(g) for g in groups) != len(fields):
            raise ValueError(f"{sum(len(g) for g in groups)} fields; {self.architecture} "
                             f"batches have {len(fields)}: {fields}")
        # Where each table field sits once the groups' outputs are concatenated.
        position = {field: k for k, field in enumerate(f for g in groups for f in g)}

        def run(encoder):
            outs = []
            for ids, mask, types in zip(input_ids, attention_mask, token_type_ids, strict=True):
                b, f, seq = ids.shape
                flat = [x.reshape(b * f, seq) for x in (ids, mask, types)]
                outs.append(encoder(*flat, deterministic=deterministic).reshape(b, f, -1))
            return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]

        def sentences(e, kind):
            cols = [position[f] for f in tables.sentence_fields(self.architecture, kind)]
            return take_fields(e, cols)

        if self.architecture == "bi":
            return (sentences(run(self.explicit_encoder), "explicit"),
                    sentences(run(self.implicit_encoder), "implicit"))
        e = run(self.encoder)
        if self.architecture == "simcse":
            e = sentences(e, "explicit")
            return e, e
        return sentences(e, "explicit"), sentences(e, "implicit")

    def encode_single(self, input_ids, attention_mask, token_type_ids, kind: str = "explicit"):
        """``[n, seq]`` inputs -> ``[n, hidden]``; bi: ``kind`` picks the encoder."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: use one of {KINDS}")
        if self.architecture == "bi":
            enc = self.explicit_encoder if kind == "explicit" else self.implicit_encoder
            return enc(input_ids, attention_mask, token_type_ids, deterministic=True)
        return self.encoder(input_ids, attention_mask, token_type_ids, deterministic=True)


def pretrained_paths(architecture: str) -> tuple[tuple[str, ...], ...]:
    """Where the pretrained transformer weights go in the parameter tree."""
    if architecture == "bi":
        return (("explicit_encoder", "transformer"), ("implicit_encoder", "transformer"))
    return (("encoder", "transformer"),)


def build_model(config, encoder_config: EncoderConfig) -> DualEncoder:
    """The model a config describes."""
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0,
                                                attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.dropout_impl,
                                            remat=config.remat)
    return DualEncoder(encoder_config.replace(dtype=config.dtype), config.architecture,
                       config.pooling)


def init_fn(model: DualEncoder):
    """``rng -> boxed params`` on dummy inputs."""
    num_fields = len(tables.FIELDS[model.architecture])

    def init(rng):
        ids = jnp.zeros((1, num_fields, 8), jnp.int32)
        return model.init({"params": rng}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))["params"]

    return init


def sentence_text_ids(text_ids, architecture: str):
    """Per-sentence ``[batch, sentences]`` from per-field ids; ValueError: wrong field count."""
    fields = tables.FIELDS[architecture]
    if text_ids.shape[1] != len(fields):
        raise ValueError(f"{architecture} batches have {len(fields)} fields {fields}; got "
                         f"{text_ids.shape[1]} text-id columns")
    return take_fields(text_ids, tables.sentence_fields(architecture, "explicit"))


def take_fields(x, cols):
    """``x[:, cols]``, as a strided slice when ``cols`` are evenly spaced."""
    cols = [int(c) for c in cols]
    if cols == list(range(x.shape[1])):
        return x
    step = cols[1] - cols[0] if len(cols) > 1 else 1
    if step > 0 and cols == list(range(cols[0], cols[-1] + 1, step)):
        return x[:, cols[0]:cols[-1] + 1:step]
    return x[:, jnp.asarray(cols)]
