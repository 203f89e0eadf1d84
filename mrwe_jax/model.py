"""The multi-resolution word embedding's equations, ConvRR and FCRR (``docs/mrwe.md``); logical
axes ``"embed"`` (d''), ``"mlp"``, ``"conv_in"``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from embedding_core import masked_mean
from embedding_core.losses.losses import l2_normalize
from mrwe_jax.features.cache import FeatureSet, normalized_weights

AGGREGATES = ("sum", "average", "concatenate")
WORD_AGGREGATES = ("sum", "average")

__all__ = ["normalized_weights"]  # re-exported: the coefficient constraint of m and u


def _check_aggregate(aggregate: str, allowed: tuple[str, ...]) -> None:
    if aggregate not in allowed:
        raise ValueError(f"aggregate must be one of {allowed}, got {aggregate!r}")


def mix_layers(layers: jax.Array, layer_weights: jax.Array, idf_weights: jax.Array,
               aggregate: str = "sum") -> jax.Array:
    """``x_i^j = f_mixture(m^j, E_i^j, w_idf)`` (sum, average or concatenate of ``m_l e_l``,
    times ``w``): ``[..., words, L, d]`` -> ``[..., words, d']`` float32."""
    _check_aggregate(aggregate, AGGREGATES)
    weighted = (
        layers.astype(jnp.float32)
        * layer_weights.astype(jnp.float32)[:, None]
        * idf_weights.astype(jnp.float32)[..., None, None]
    )
    if aggregate == "sum":
        return weighted.sum(axis=-2)
    if aggregate == "average":
        return weighted.mean(axis=-2)
    return weighted.reshape(*weighted.shape[:-2], -1)


def ensemble_sources(mixtures: Sequence[jax.Array], source_weights: jax.Array,
                     aggregate: str = "concatenate") -> jax.Array:
    """``x_i = f_ensemble(u, {x^j})``: ``"sum"``, ``"average"`` (``1/n sum_j u_j x^j``) or
    ``"concatenate"``; n ``[..., words, d'_j]`` -> ``[..., words, d'']`` float32. ValueError: no
    sources, u of the wrong length, sum / average over different widths."""
    _check_aggregate(aggregate, AGGREGATES)
    if not mixtures:
        raise ValueError("ensemble_sources needs at least one source")
    if source_weights.shape != (len(mixtures),):
        raise ValueError(
            f"source_weights must have shape ({len(mixtures)},), got {source_weights.shape}"
        )
    widths = [int(x.shape[-1]) for x in mixtures]
    if aggregate != "concatenate" and len(set(widths)) > 1:
        raise ValueError(
            f"ensemble aggregate {aggregate!r} needs sources of equal width, got widths "
            f"{widths}; use 'concatenate' or choose layer aggregates / sources of one width"
        )
    parts = [x.astype(jnp.float32) * source_weights[j].astype(jnp.float32)
             for j, x in enumerate(mixtures)]
    if aggregate == "concatenate":
        return jnp.concatenate(parts, axis=-1)
    total = sum(parts[1:], parts[0])
    return total / len(parts) if aggregate == "average" else total


def pool_words(words: jax.Array, mask: jax.Array, aggregate: str = "average") -> jax.Array:
    """``[..., d]`` float32 ``"average"`` (no word: zeros) or ``"sum"`` of the ``mask``ed words."""
    _check_aggregate(aggregate, WORD_AGGREGATES)
    if aggregate == "average":
        return masked_mean(words, mask)
    m = mask.astype(jnp.float32)
    return jnp.einsum("...wd,...w->...d", words.astype(jnp.float32), m,
                      precision=jax.lax.Precision.HIGHEST)


class MultiResolutionEmbedding(nn.Module):
    """Mixture, ensemble, pooling with fixed or learned (softmax) m^j and u -> ``(words [batch,
    words, d''], text [batch, d''])`` float32; ValueError: inputs unlike the configuration."""

    layer_counts: tuple[int, ...]
    layer_weights: tuple[tuple[float, ...], ...] | None = None
    source_weights: tuple[float, ...] | None = None
    learn_layer_weights: bool = False
    learn_source_weights: bool = False
    layer_aggregate: str = "sum"
    source_aggregate: str = "concatenate"
    word_aggregate: str = "average"

    def _coefficients(self, name: str, init: Sequence[float] | None, size: int,
                      learn: bool) -> jax.Array:
        base = normalized_weights(np.ones(size) if init is None else init, name)
        if base.shape != (size,):
            raise ValueError(f"{name} has {base.size} entries, expected {size}")
        if not learn:
            return jnp.asarray(base)
        logits0 = np.log(np.maximum(base, 1e-30)).astype(np.float32)
        logits = self.param(
            name, nn.with_logical_partitioning(lambda *_: jnp.asarray(logits0), (None,))
        )
        return jax.nn.softmax(logits)

    @nn.compact
    def __call__(self, layers: Sequence[jax.Array], idf_weights: jax.Array, mask: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
        if len(layers) != len(self.layer_counts):
            raise ValueError(f"got {len(layers)} sources, configured for {len(self.layer_counts)}")
        if self.layer_weights is not None and len(self.layer_weights) != len(layers):
            raise ValueError(
                f"layer_weights has {len(self.layer_weights)} entries for {len(layers)} sources"
            )
        mixtures = []
        for j, (x, count) in enumerate(zip(layers, self.layer_counts, strict=True)):
            if x.shape[-2] != count:
                raise ValueError(f"source {j} has {x.shape[-2]} layers, configured {count}")
            init = None if self.layer_weights is None else self.layer_weights[j]
            m = self._coefficients(f"layer_logits_{j}", init, count, self.learn_layer_weights)
            mixtures.append(mix_layers(x, m, idf_weights, self.layer_aggregate))
        u = self._coefficients(
            "source_logits", self.source_weights, len(layers), self.learn_source_weights
        )
        words = ensemble_sources(mixtures, u, self.source_aggregate)
        words = words * mask.astype(words.dtype)[..., None]
        return words, pool_words(words, mask, self.word_aggregate)


class TextBatch(NamedTuple):
    """A tower input: ``text [batch, d'']``; ConvRR adds ``words [batch, L, d'']``, ``mask``."""

    text: jax.Array
    words: jax.Array | None = None
    mask: jax.Array | None = None


def _kernel_init(axes: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)


def _bias_init(axes: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class ConvRR(nn.Module):
    """``o = normalize(x + sf * pool(blocks(X)))``: ``num_blocks`` SAME 1-D convolutions + ReLU,
    padding zeroed around every block; ``kernels != d''``: a projection back (our addition)."""

    num_blocks: int = 1
    window_size: int = 5
    kernels: int | None = None
    scale: float = 0.05

    @nn.compact
    def __call__(self, batch: TextBatch, *, deterministic: bool = True) -> jax.Array:
        """``batch`` with words and mask; returns ``[batch, d'']`` float32 unit vectors."""
        if batch.words is None or batch.mask is None:
            raise ValueError("ConvRR needs the word matrices and their mask in the TextBatch")
        text = batch.text.astype(jnp.float32)
        dim = text.shape[-1]
        if batch.words.shape[-1] != dim:
            raise ValueError(f"word width {batch.words.shape[-1]} differs from text width {dim}")
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        features = dim if self.kernels is None else self.kernels
        keep = batch.mask.astype(jnp.float32)[..., None]
        h = batch.words.astype(jnp.float32) * keep
        for i in range(self.num_blocks):
            in_axis = "embed" if i == 0 else "conv_in"
            h = nn.Conv(
                features, kernel_size=(self.window_size,), padding="SAME",
                kernel_init=_kernel_init((None, in_axis, "mlp")), bias_init=_bias_init(("mlp",)),
                precision=jax.lax.Precision.HIGHEST, name=f"conv_{i}",
            )(h)
            h = nn.relu(h) * keep
        pooled = masked_mean(h, batch.mask)
        if features != dim:
            pooled = nn.Dense(
                dim, use_bias=False, kernel_init=_kernel_init(("mlp", "embed")),
                precision=jax.lax.Precision.HIGHEST, name="projection",
            )(pooled)
        return l2_normalize(text + self.scale * pooled)


class FCRR(nn.Module):
    """``num_blocks`` of ``x <- x + sf * (W2 dropout(relu(W1 x + b1)) + b2)``, then unit norm."""

    num_blocks: int = 2
    hidden: int = 1024
    scale: float = 0.05
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, batch: TextBatch, *, deterministic: bool = True) -> jax.Array:
        """Returns ``[batch, d'']`` float32 unit vectors."""
        x = batch.text.astype(jnp.float32)
        dim = x.shape[-1]
        for i in range(self.num_blocks):
            h = nn.Dense(
                self.hidden, kernel_init=_kernel_init(("embed", "mlp")),
                bias_init=_bias_init(("mlp",)), precision=jax.lax.Precision.HIGHEST,
                name=f"block_{i}_relu",
            )(x)
            h = nn.Dropout(self.dropout_rate)(nn.relu(h), deterministic=deterministic)
            h = nn.Dense(
                dim, kernel_init=_kernel_init(("mlp", "embed")),
                bias_init=_bias_init(("embed",)), precision=jax.lax.Precision.HIGHEST,
                name=f"block_{i}_linear",
            )(h)
            x = x + self.scale * h
        return l2_normalize(x)


class SiameseRetriever(nn.Module):
    """One tower for both sides; ``question_only`` leaves paragraphs at their input vectors."""

    tower: nn.Module
    question_only: bool = False

    def encode(self, batch: TextBatch, is_question: bool, *,
               deterministic: bool = True) -> jax.Array:
        """``[batch, d'']`` float32 unit vectors of one side."""
        if self.question_only and not is_question:
            return l2_normalize(batch.text.astype(jnp.float32))
        return self.tower(batch, deterministic=deterministic)

    def __call__(self, questions: TextBatch, paragraphs: TextBatch, *,
                 deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
        """``(questions [b_q, d''], paragraphs [b_p, d''])`` float32 unit vectors."""
        return (self.encode(questions, True, deterministic=deterministic),
                self.encode(paragraphs, False, deterministic=deterministic))


def with_words(config: ml_collections.ConfigDict) -> bool:
    """ConvRR reads the word matrices; FCRR only the text vectors."""
    return config.tower == "convrr"


def build_model(config: ml_collections.ConfigDict) -> SiameseRetriever:
    """The Siamese retriever with the configured tower."""
    if config.tower == "convrr":
        tower = ConvRR(num_blocks=int(config.num_blocks), window_size=int(config.window_size),
                       kernels=int(config.kernels) or None, scale=float(config.scale))
    else:
        tower = FCRR(num_blocks=int(config.num_blocks), hidden=int(config.fcrr_hidden),
                     scale=float(config.scale), dropout_rate=float(config.dropout_rate))
    return SiameseRetriever(tower=tower, question_only=bool(config.question_only))


def text_batch(features: jax.Array, mask: jax.Array | None, widths: Sequence[int],
               source_weights: Any, source_aggregate: str, word_aggregate: str) -> TextBatch:
    """One side's tower input: ``f_ensemble`` of ``[b, L, sum_j d_j]`` word matrices (with ``mask
    [b, L]``) or ``[b, sum_j d_j]`` vectors, then pooling; ``source_weights`` ``[n]`` u."""
    u = jnp.asarray(source_weights, jnp.float32)
    parts = jnp.split(features, np.cumsum(widths)[:-1].tolist(), axis=-1)
    mixed = ensemble_sources(parts, u, source_aggregate)
    if mask is None:
        return TextBatch(text=mixed)
    return TextBatch(text=pool_words(mixed, mask, word_aggregate), words=mixed, mask=mask)


def side_inputs(features: jax.Array, mask: jax.Array | None, feature_set: FeatureSet) -> TextBatch:
    """:func:`text_batch` with ``feature_set``'s widths, u and aggregates."""
    return text_batch(features, mask, feature_set.widths,
                      np.asarray(feature_set.source_weights), feature_set.source_aggregate,
                      feature_set.word_aggregate)


def init_fn(model: SiameseRetriever, features: FeatureSet, config: ml_collections.ConfigDict):
    """``rng -> params`` boxed with logical axis names (the ``Task``'s ``init_params``)."""
    width = sum(features.widths)
    words = with_words(config)
    x = np.zeros((1, 8, width) if words else (1, width), np.float32)
    side = side_inputs(x, np.ones((1, 8), bool) if words else None, features)

    def init(rng):
        return model.init(rng, side, side)["params"]

    return init
