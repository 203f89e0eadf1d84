"""The multi-resolution word embedding's equations, ConvRR and FCRR, and their Siamese use.

Equations (``docs/mrwe.md``): ``f_mixture`` (:func:`mix_layers`: a source's layers weighted
by ``m^j`` and the word's IDF), ``f_ensemble`` (:func:`ensemble_sources`: the sources
weighted by ``u``) and the text vector (:func:`pool_words`); :class:`MultiResolutionEmbedding`
is the three as a Flax module with fixed or learned coefficients. :func:`text_batch` applies
``f_ensemble`` and the pooling on device to the cached per-source features
(``data_pipelines.word_features``).

Towers: ConvRR (convolutional residual retrieval) and FCRR (fully connected residual
retrieval), both mapping a text to ``normalize(x + sf * f(x))``: a residual correction of
the pre-trained multi-resolution text embedding ``x`` scaled by the constant ``sf``, so
training with little data adjusts the embedding rather than replacing it.

Parameters carry logical axis names: ``"embed"`` for the embedding width d'', ``"mlp"`` for
the hidden / kernel width, ``"conv_in"`` for the input channels of the second and later
convolutions (a separate name so that no kernel maps two axes to one mesh axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from data_pipelines.word_features import FeatureSet, normalized_weights
from embedding_core.inference import masked_mean
from embedding_core.losses import l2_normalize

AGGREGATES = ("sum", "average", "concatenate")
WORD_AGGREGATES = ("sum", "average")
SIDES = ("q_", "p_")  # batch key prefixes of the question and paragraph sides

__all__ = ["normalized_weights"]  # re-exported: the coefficient constraint of m and u


# --------------------------------------------------------------------------- equations


def _check_aggregate(aggregate: str, allowed: tuple[str, ...]) -> None:
    if aggregate not in allowed:
        raise ValueError(f"aggregate must be one of {allowed}, got {aggregate!r}")


def mix_layers(
    layers: jax.Array,
    layer_weights: jax.Array,
    idf_weights: jax.Array,
    aggregate: str = "sum",
) -> jax.Array:
    """``f_mixture`` of one embedding model (``docs/mrwe.md``, ``x_i^j``).

    ``x_i^j = f_mixture(m^j, E_i^j, w_idf)``: layer l of word i is weighted by ``m^j_l`` and
    by the word's IDF, then the layers are aggregated:

    - ``"sum"``: ``w_idf * sum_l m_l e_l``, ``d' = d``;
    - ``"average"``: ``w_idf * (1/L) sum_l m_l e_l``, ``d' = d``;
    - ``"concatenate"``: ``w_idf * [m_1 e_1; ...; m_L e_L]``, ``d' = L * d``.

    Args:
      layers: ``[..., num_words, L, d]`` float.
      layer_weights: ``[L]`` float, ``m^j`` (callers keep them summing to 1).
      idf_weights: ``[..., num_words]`` float.
      aggregate: one of :data:`AGGREGATES`.

    Returns:
      ``[..., num_words, d']`` float32.

    Raises:
      ValueError: unknown ``aggregate``.
    """
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


def ensemble_sources(
    mixtures: Sequence[jax.Array],
    source_weights: jax.Array,
    aggregate: str = "concatenate",
) -> jax.Array:
    """``f_ensemble`` over n embedding models (``docs/mrwe.md``, ``x_i``).

    ``x_i = f_ensemble(u, X'_i)`` with ``X'_i = {x_i^1, ..., x_i^n}``: model j weighted by
    ``u_j``, aggregated by ``"sum"`` (``sum_j u_j x^j``), ``"average"`` (``(1/n) sum_j u_j
    x^j``) or ``"concatenate"`` (``[u_1 x^1; ...; u_n x^n]``, ``d'' = sum_j d'_j``).

    Args:
      mixtures: n arrays ``[..., num_words, d'_j]``.
      source_weights: ``[n]`` float, ``u``.
      aggregate: one of :data:`AGGREGATES`.

    Returns:
      ``[..., num_words, d'']`` float32.

    Raises:
      ValueError: no sources; ``u`` of the wrong length; sum/average over sources of
        different widths (the paper "coerces to a common length"; we require it of the
        caller instead of guessing a projection: choose equal widths or "concatenate").
    """
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




class MultiResolutionEmbedding(nn.Module):
    """Steps 3 to 5 of the method with fixed or learned coefficients m^j and u.

    Learned coefficients are ``softmax(logits)`` (so they stay positive and sum to 1),
    initialised to the given fixed values (uniform by default); fixed ones are the given
    values scaled to sum 1 (:func:`normalized_weights`).

    Attributes:
      layer_counts: L_j of each source, in the order of the ``layers`` argument.
      layer_weights: per source ``m^j`` (or its initial value); None: uniform.
      source_weights: ``u`` (or its initial value); None: uniform.
      learn_layer_weights, learn_source_weights: make m / u trainable.
      layer_aggregate, source_aggregate: see :func:`mix_layers`, :func:`ensemble_sources`.
      word_aggregate: see :func:`pool_words`.

    Call:
      layers: n arrays ``[batch, num_words, L_j, d_j]`` float.
      idf_weights: ``[batch, num_words]`` float.
      mask: ``[batch, num_words]`` bool, true for real words.

    Returns:
      ``(words [batch, num_words, d''] float32`` with padding rows zero,
      ``text [batch, d''] float32)``.

    Raises:
      ValueError: the number of sources or of layers differs from the configuration, a
      weight vector has the wrong length or is not non-negative, or an unknown aggregate.
    """

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
    def __call__(
        self, layers: Sequence[jax.Array], idf_weights: jax.Array, mask: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        if len(layers) != len(self.layer_counts):
            raise ValueError(
                f"got {len(layers)} sources, configured for {len(self.layer_counts)}"
            )
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

def pool_words(words: jax.Array, mask: jax.Array, aggregate: str = "average") -> jax.Array:
    """Text vector from its word vectors; padding rows are excluded.

    Args:
      words: ``[..., num_words, d]`` float.
      mask: ``[..., num_words]`` bool / int, true for real words.
      aggregate: ``"sum"`` or ``"average"`` (``embedding_core.inference.masked_mean``:
        divides by the number of real words; a text with none gets the zero vector, not NaN).

    Returns:
      ``[..., d]`` float32.

    Raises:
      ValueError: unknown ``aggregate``.
    """
    _check_aggregate(aggregate, WORD_AGGREGATES)
    if aggregate == "average":
        return masked_mean(words, mask)
    m = mask.astype(jnp.float32)
    return jnp.einsum("...wd,...w->...d", words.astype(jnp.float32), m,
                      precision=jax.lax.Precision.HIGHEST)


# --------------------------------------------------------------------------- towers


class TextBatch(NamedTuple):
    """Inputs of one side (questions or paragraphs).

    Attributes:
      text: ``[batch, d'']`` float32 multi-resolution text vectors.
      words: ``[batch, num_words, d'']`` float32 word matrices (ConvRR only), zero-padded.
      mask: ``[batch, num_words]`` bool, true for real words (ConvRR only).
    """

    text: jax.Array
    words: jax.Array | None = None
    mask: jax.Array | None = None


def _kernel_init(axes: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)


def _bias_init(axes: tuple[str | None, ...]) -> nn.initializers.Initializer:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class ConvRR(nn.Module):
    """Convolutional Residual Retrieval network (``docs/mrwe.md``).

    ``o = normalize(x + sf * pool(conv_blocks(X)))``: ``num_blocks`` blocks of a 1-D
    convolution (``kernels`` = d'' kernels of ``window_size`` = ws words, SAME padding) and
    ReLU over the word matrix X, average pooling over the real words, scaling by ``sf``,
    residual addition to the text embedding x, unit l2 norm.

    Padding: the word matrix is zeroed at padded positions before the first convolution and
    after every block, so a padded position acts exactly like SAME's zero padding at the end
    of the text, and the pooling divides by the number of real words; the output of a text
    does not depend on how much padding its batch has. A text with no word gets pooled 0,
    so its output is ``normalize(x)`` (0 for a zero x, with finite gradients).

    With ``kernels`` != d'' a bias-free dense projection ``("mlp", "embed")`` maps the pooled
    features back to d'' (our addition; the paper uses d'' kernels). The authors' code used
    stride 2 and min-pooling in one variant; the paper's stride-1 convolution and average
    pooling are what is implemented.

    Attributes:
      num_blocks: convolution + ReLU blocks (>= 1).
      window_size: ws, words per kernel.
      kernels: d'', number of kernels; None: the input width.
      scale: sf, the constant residual scale.
    """

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
            raise ValueError(
                f"word width {batch.words.shape[-1]} differs from text width {dim}"
            )
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        features = dim if self.kernels is None else self.kernels
        keep = batch.mask.astype(jnp.float32)[..., None]
        h = batch.words.astype(jnp.float32) * keep
        for i in range(self.num_blocks):
            in_axis = "embed" if i == 0 else "conv_in"
            h = nn.Conv(
                features,
                kernel_size=(self.window_size,),
                padding="SAME",
                kernel_init=_kernel_init((None, in_axis, "mlp")),
                bias_init=_bias_init(("mlp",)),
                precision=jax.lax.Precision.HIGHEST,
                name=f"conv_{i}",
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
    """Fully Connected Residual Retrieval network (``docs/mrwe.md``).

    ``num_blocks`` residual blocks on the text vector, each
    ``x <- x + sf * W2 dropout(relu(W1 x + b1)) + sf * b2`` (hidden width ``hidden``,
    output width d''), then unit l2 norm. The word matrices are not used.

    Attributes:
      num_blocks: residual blocks (the authors' logged run: 2).
      hidden: width of each block's ReLU layer.
      scale: sf (the authors' logged run: 0.05).
      dropout_rate: dropout after the ReLU (0 disables; needs a ``"dropout"`` rng when
        ``deterministic=False``).
    """

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
    """The same tower for questions and paragraphs (the paper's Siamese set-up, ``docs/mrwe.md``).

    ``question_only=True`` reproduces the authors' code: only questions go through the tower,
    paragraphs keep their (unit-normalised) pre-trained text vectors.

    Attributes:
      tower: a :class:`ConvRR` or :class:`FCRR` (one parameter set for both sides).
      question_only: see above.
    """

    tower: nn.Module
    question_only: bool = False

    def encode(self, batch: TextBatch, is_question: bool, *,
               deterministic: bool = True) -> jax.Array:
        """``[batch, d'']`` float32 unit vectors of one side."""
        if self.question_only and not is_question:
            return l2_normalize(batch.text.astype(jnp.float32))
        return self.tower(batch, deterministic=deterministic)

    def __call__(
        self, questions: TextBatch, paragraphs: TextBatch, *, deterministic: bool = True
    ) -> tuple[jax.Array, jax.Array]:
        """Returns ``(questions [b_q, d''], paragraphs [b_p, d''])`` float32 unit vectors."""
        return (
            self.encode(questions, True, deterministic=deterministic),
            self.encode(paragraphs, False, deterministic=deterministic),
        )


# --------------------------------------------------------------------------- config -> model


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


def text_batch(
    batch: Mapping[str, jax.Array], prefix: str, names: Sequence[str], source_weights: Any,
    source_aggregate: str, word_aggregate: str, words: bool,
) -> TextBatch:
    """One side of a batch as the tower's input: the multi-resolution ensemble on device.

    :func:`ensemble_sources` of the per-source mixtures; with ``words`` the word matrices
    ``[b, L, d'']`` are ensembled and pooled over the real words into the text vector, else
    the pooled per-source vectors ``[b, d_j]`` are.

    Args:
      batch: ``{prefix + name: [b, L, d_j] or [b, d_j], prefix + "mask": [b, L] bool}``.
      prefix: ``"q_"`` or ``"p_"``.
      source_weights: ``[n_sources]`` ``u``.

    Returns:
      :class:`TextBatch` (float32).
    """
    u = jnp.asarray(source_weights, jnp.float32)
    parts = [batch[prefix + n] for n in names]
    mixed = ensemble_sources(parts, u, source_aggregate)
    if not words:
        return TextBatch(text=mixed)
    mask = batch[prefix + "mask"]
    return TextBatch(text=pool_words(mixed, mask, word_aggregate), words=mixed, mask=mask)


def side_inputs(batch: Mapping[str, jax.Array], prefix: str, features: FeatureSet,
                config: ml_collections.ConfigDict) -> TextBatch:
    """:func:`text_batch` with the features' sources, ``u`` and aggregates."""
    return text_batch(batch, prefix, features.names, np.asarray(features.source_weights),
                      features.source_aggregate, features.word_aggregate, with_words(config))


def example_batch(features: FeatureSet, config: ml_collections.ConfigDict,
                  rows: int = 1, width: int = 8) -> dict[str, np.ndarray]:
    """Zero inputs of the right widths (parameter shapes do not depend on rows or width)."""
    out: dict[str, np.ndarray] = {}
    for prefix in SIDES:
        for n in features.names:
            dim = features.questions[n].dim
            shape = (rows, width, dim) if with_words(config) else (rows, dim)
            out[prefix + n] = np.zeros(shape, np.float32)
        if with_words(config):
            out[prefix + "mask"] = np.ones((rows, width), bool)
    return out


def init_fn(model: SiameseRetriever, features: FeatureSet, config: ml_collections.ConfigDict):
    """``rng -> params`` boxed with logical axis names (the ``Task``'s ``init_params``)."""
    example = example_batch(features, config)
    sides = [side_inputs(example, p, features, config) for p in SIDES]

    def init(rng):
        return model.init(rng, *sides)["params"]

    return init


def encode_batch(model: SiameseRetriever, params: Any, batch: Mapping[str, jax.Array],
                 features: FeatureSet, config: ml_collections.ConfigDict, *,
                 deterministic: bool = True, rng: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array]:
    """``(questions [b_q, d''], paragraphs [b_p, d''])`` float32 unit vectors of a batch."""
    sides = [side_inputs(batch, p, features, config) for p in SIDES]
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": params}, *sides, deterministic=deterministic, rngs=rngs)
