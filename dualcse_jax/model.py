"""DualCSE encoders (cross and bi) and the one-vector SimCSE sentence encoder.

DualCSE (Oda et al., arXiv 2510.09293) gives each sentence two vectors in one space:
``r`` (explicit meaning) and ``u`` (implicit meaning).

* cross-encoder: one transformer; ``r`` from ``[CLS] s [SEP] explicit [SEP]`` and ``u`` from
  ``[CLS] s [SEP] implicit [SEP]`` (the indicator pairing happens in tokenisation);
* bi-encoder: two transformers, one for ``r`` and one for ``u``, on the plain sentence.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from embedding_core.encoders import EncoderConfig, TransformerEncoder

POOLINGS = ("cls", "cls_mlp", "mean")
ARCHITECTURES = ("cross", "bi", "simcse")


class Pooler(nn.Module):
    """Sentence vector from token states.

    * ``cls``: the first token's final state;
    * ``cls_mlp``: SimCSE's head, ``tanh(W h_cls + b)`` with a freshly initialised W (not
      BERT's NSP pooler); used at training *and* evaluation, so the head that was trained
      is the head that is used (PITFALLS);
    * ``mean``: average over real tokens only (padding excluded; sentence-transformers'
      MiniLM pooling).

    Input ``hidden [batch, seq_len, hidden]``, ``mask [batch, seq_len] int32``; output
    ``[batch, hidden]`` float32.
    """

    kind: str = "cls"

    @nn.compact
    def __call__(self, hidden: jax.Array, mask: jax.Array) -> jax.Array:
        hidden = hidden.astype(jnp.float32)
        if self.kind == "mean":
            m = mask.astype(jnp.float32)[..., None]
            return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
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
    """Transformer + pooler: ``[n, seq_len]`` int32 token ids -> ``[n, hidden]`` float32."""

    config: EncoderConfig
    pooling: str = "cls"

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids, *, deterministic=True):
        out = TransformerEncoder(self.config, name="transformer")(
            input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return Pooler(self.pooling, name="pooler")(out.last_hidden_state, attention_mask)


class DualEncoder(nn.Module):
    """DualCSE cross/bi encoder, or (``architecture="simcse"``) a one-vector encoder.

    Inputs are ``[batch, fields, seq_len]`` int32 arrays from ``data_pipelines``:

    * cross: fields alternate (sentence k with "explicit", sentence k with "implicit");
    * bi and simcse: one field per sentence.

    Returns:
      ``(r, u)``, each ``[batch, sentences, hidden]`` float32. For ``simcse`` ``u is r``.
    """

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
        """Encodes every field.

        Each input is either one ``[batch, fields, seq_len]`` array or a tuple of them, one
        per length group (consecutive runs of fields padded to their own length; see
        ``data_pipelines.pipeline.make_batches(length_groups=...)``).
        """
        if not isinstance(input_ids, (tuple, list)):
            input_ids, attention_mask, token_type_ids = (
                (input_ids,), (attention_mask,), (token_type_ids,))

        def run(encoder):
            outs = []
            for ids, mask, types in zip(input_ids, attention_mask, token_type_ids, strict=True):
                b, f, seq = ids.shape
                flat = [x.reshape(b * f, seq) for x in (ids, mask, types)]
                outs.append(encoder(*flat, deterministic=deterministic).reshape(b, f, -1))
            return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]

        if self.architecture == "bi":
            return run(self.explicit_encoder), run(self.implicit_encoder)
        e = run(self.encoder)
        if self.architecture == "simcse":
            return e, e
        b, f, dim = e.shape
        if f % 2:
            raise ValueError(f"cross-encoder needs (explicit, implicit) field pairs, got {f}")
        e = e.reshape(b, f // 2, 2, dim)
        return e[:, :, 0], e[:, :, 1]

    def encode_single(self, input_ids, attention_mask, token_type_ids, part: str = "r"):
        """Encodes ``[n, seq_len]`` inputs with one encoder, for inference.

        For cross and simcse the indicator (if any) is already in the tokens; for bi,
        ``part`` picks the explicit (``"r"``) or implicit (``"u"``) encoder.
        """
        if self.architecture == "bi":
            enc = self.explicit_encoder if part == "r" else self.implicit_encoder
            return enc(input_ids, attention_mask, token_type_ids, deterministic=True)
        return self.encoder(input_ids, attention_mask, token_type_ids, deterministic=True)


def pretrained_paths(architecture: str) -> tuple[tuple[str, ...], ...]:
    """Where the pretrained transformer weights go in this model's parameter tree."""
    if architecture == "bi":
        return (("explicit_encoder", "transformer"), ("implicit_encoder", "transformer"))
    return (("encoder", "transformer"),)


def build_model(config, encoder_config: EncoderConfig) -> DualEncoder:
    """The model a config describes (``architecture``, ``pooling``, ``dtype``, ``dropout``)."""
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0,
                                                attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.get("dropout_impl", "flax"))
    return DualEncoder(encoder_config.replace(dtype=config.dtype), config.architecture,
                       config.pooling)


def init_fn(model: DualEncoder, num_fields: int):
    """``rng -> boxed params`` for ``model`` on ``[1, num_fields, 8]`` dummy inputs."""

    def init(rng):
        ids = jnp.zeros((1, num_fields, 8), jnp.int32)
        return model.init({"params": rng}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))["params"]

    return init


def length_groups(architecture: str) -> tuple[tuple[int, ...], ...]:
    """Field groups padded separately: the (long) premise apart from the (short) hypotheses.

    Field order is that of ``data_pipelines.dualcse_data``: cross has the premise's two
    indicator views first, bi and simcse the premise / anchor first.
    """
    if architecture == "cross":
        return ((0, 1), (2, 3, 4, 5, 6, 7))
    if architecture == "bi":
        return ((0,), (1, 2, 3))
    return ((0,), (1, 2))


def model_inputs(batch) -> tuple:
    """``(input_ids, attention_mask, token_type_ids)`` of a batch, grouped or not."""
    names = ("input_ids", "attention_mask", "token_type_ids")
    if "input_ids" in batch:
        return tuple(batch[n] for n in names)
    groups = sorted(int(k.rsplit("_", 1)[1]) for k in batch if k.startswith("input_ids_"))
    return tuple(tuple(batch[f"{n}_{g}"] for g in groups) for n in names)


def sentence_text_ids(text_ids, architecture: str):
    """Per-sentence identities ``[batch, sentences]`` from per-field ``[batch, fields]`` ids.

    The cross-encoder's fields are the (explicit, implicit) indicator views of each sentence
    in turn, and both views carry the sentence's id: keep one column per sentence, so that
    column k names the sentence of ``r[:, k]`` / ``u[:, k]``. Bi and simcse have one field
    per sentence already.

    Raises:
      ValueError: a cross batch with an odd number of fields.
    """
    if architecture != "cross":
        return text_ids
    if text_ids.shape[1] % 2:
        raise ValueError(f"cross-encoder batches have (explicit, implicit) field pairs; "
                         f"got {text_ids.shape[1]} text-id columns")
    return text_ids[:, ::2]
