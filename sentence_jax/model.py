"""The trained model: a sentence-transformers folder's Transformer, Pooling, Dense and
Normalize modules as one flax module, its Dense layers trained too (``docs/sentence.md``)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from embedding_core import ACTIVATIONS, EncoderConfig, TransformerEncoder, l2_normalize, pool


class SentenceModel(nn.Module):
    """``[rows, L]`` ids, mask, types -> ``[rows, dim]`` float32 sentence embeddings."""

    config: EncoderConfig
    pooling: tuple[str, ...] = ("mean",)
    dense: tuple[tuple[int, bool, str], ...] = ()  # (out features, bias, activation)
    normalize: bool = False

    @nn.compact
    def __call__(self, ids: jax.Array, mask: jax.Array, types: jax.Array, *,
                 deterministic: bool = True) -> jax.Array:
        hidden = TransformerEncoder(self.config, name="transformer")(
            ids, mask, types, deterministic=deterministic).last_hidden_state
        x = pool(hidden, mask, self.pooling)
        for i, (features, bias, activation) in enumerate(self.dense):
            x = nn.Dense(features, use_bias=bias, name=f"dense_{i}", dtype=jnp.float32)(x)
            x = ACTIVATIONS[activation](x)
        return l2_normalize(x) if self.normalize else x


def build_model(config, encoder_config: EncoderConfig, pipeline) -> SentenceModel:
    """The model of a run config (dtype, dropout, remat) and a folder's modules."""
    if not config.dropout:
        encoder_config = encoder_config.replace(hidden_dropout_rate=0.0,
                                                attention_dropout_rate=0.0)
    encoder_config = encoder_config.replace(dropout_impl=config.dropout_impl,
                                            remat=config.remat, dtype=config.dtype)
    dense = tuple((int(k.shape[1]), b is not None, a) for k, b, a in pipeline.dense)
    return SentenceModel(encoder_config, tuple(pipeline.pooling), dense, pipeline.normalize)


def pretrained_params(params, pipeline) -> dict[tuple[str, ...], dict]:
    """``Task.pretrained``: the transformer's and each Dense layer's weights."""
    out = {("transformer",): params}
    for i, (kernel, bias, _) in enumerate(pipeline.dense):
        out[(f"dense_{i}",)] = {"kernel": kernel, **({} if bias is None else {"bias": bias})}
    return out


def init_fn(model: SentenceModel):
    """``rng -> params`` on dummy inputs."""

    def init(rng):
        ids = jnp.zeros((1, 8), jnp.int32)
        return model.init({"params": rng}, ids, jnp.ones_like(ids), ids)["params"]

    return init
