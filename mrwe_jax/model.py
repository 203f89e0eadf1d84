"""ConvRR and FCRR retrieval networks on multi-resolution embeddings, and their Siamese use.

ConvRR: Cakaloglu & Xu, "A Multi-Resolution Word Embedding for Document Retrieval from Large
Unstructured Knowledge Bases", arXiv 1902.00663, sec. 3.2 and Figure 2. FCRR: Cakaloglu,
Szegedy & Xu, "Text Embeddings for Retrieval From a Large Knowledge Base", arXiv 1810.10176.

Both towers map a text to ``normalize(x + sf * f(x))``: a residual correction of the
pre-trained multi-resolution text embedding ``x`` scaled by the constant ``sf``, so training
with little data adjusts the embedding rather than replacing it.

Parameters carry logical axis names: ``"embed"`` for the embedding width d'', ``"mlp"`` for
the hidden / kernel width, ``"conv_in"`` for the input channels of the second and later
convolutions (a separate name so that no kernel maps two axes to one mesh axis).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from embedding_core.losses import l2_normalize


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


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over axis -2 of the rows where ``mask`` is true.

    Divides by the number of real rows, not by the padded length (the authors' code averaged
    over the padding too). A row set with no real row gives 0, not NaN.

    Args:
      x: ``[batch, num_words, features]`` float.
      mask: ``[batch, num_words]`` bool.

    Returns:
      ``[batch, features]`` float32.
    """
    m = mask.astype(jnp.float32)
    total = jnp.einsum("bwf,bw->bf", x.astype(jnp.float32), m,
                       precision=jax.lax.Precision.HIGHEST)
    return total / jnp.maximum(m.sum(axis=-1), 1.0)[:, None]


class ConvRR(nn.Module):
    """Convolutional Residual Retrieval network (arXiv 1902.00663, sec. 3.2).

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
    """Fully Connected Residual Retrieval network (arXiv 1810.10176).

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
    """The same tower for questions and paragraphs (the paper's Siamese set-up, Figure 3).

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
