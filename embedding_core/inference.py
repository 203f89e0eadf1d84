"""The one inference layer: pooling, the length-sorted encode loop and the ``Encoder`` base.

Every loaded model is an :class:`Encoder` whose ``encode`` returns one float32 ``[N, dim]``
array; texts run longest first, widths rounded up to ``pad_multiple`` (few compiled shapes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# (rows [b] int, width) -> model inputs for those texts padded to ``width`` and to the
# fixed batch size; the encode loop hands them to the forward function unchanged.
BatchBuilder = Callable[[np.ndarray, int], Any]
# model inputs -> [batch_size, dim] vectors (numpy or jax).
Forward = Callable[[Any], Any]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over the real positions of a padded sequence (sentence-transformers' pooling):
    ``x`` ``[..., L, d]`` any float (summed in float32), ``mask`` ``[..., L]`` 1/True for
    real positions -> ``[..., d]`` float32 (zeros for a row with no real position).
    """
    m = mask.astype(jnp.float32)[..., None]
    total = jnp.sum(x.astype(jnp.float32) * m, axis=-2)
    return total / jnp.maximum(jnp.sum(m, axis=-2), 1.0)


def l2_normalize(x: np.ndarray | jax.Array, eps: float = 1e-12):
    """Rows scaled to unit L2 norm (a zero row stays zero); numpy in, numpy out."""
    xp = jnp if isinstance(x, jax.Array) else np
    norm = xp.linalg.norm(x, axis=-1, keepdims=True)
    return x / xp.maximum(norm, eps)


# Rows this process has passed through a model in encode_in_batches: the multi-process
# tests read it to see that each process encoded only its slice.
_encoded_rows = 0


def encoded_rows() -> int:
    """Rows this process has encoded so far (every model's :func:`encode_in_batches`)."""
    return _encoded_rows


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-int(n) // int(multiple)) * int(multiple)


def encode_in_batches(
    lengths: np.ndarray,
    build_batch: BatchBuilder,
    forward: Forward,
    *,
    batch_size: int,
    pad_multiple: int = 8,
    max_width: int | None = None,
    show_progress_bar: bool = False,
    desc: str = "encode",
    rows_out: bool = False,
) -> np.ndarray | list[np.ndarray]:
    """Runs ``forward`` over texts sorted by length; returns rows in input order.

    Args:
      lengths: ``[N]`` int, each text's length in the unit ``build_batch`` pads.
      build_batch: :data:`BatchBuilder`; pads the rows to ``batch_size`` (one compile per
        width).
      max_width: cap on the width (e.g. the tokenised array's width).
      rows_out: return each row's own result (``result[i]``) in a list, not one matrix.

    Returns:
      ``[N, dim]`` float32 (``[0, 0]`` for no texts), or N float32 arrays (``rows_out``).

    Raises:
      ValueError: ``batch_size`` or ``pad_multiple`` below 1.
    """
    if int(batch_size) < 1 or int(pad_multiple) < 1:
        raise ValueError(f"batch_size ({batch_size}) and pad_multiple ({pad_multiple}) must "
                         "be >= 1")
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    starts = range(0, len(lengths), int(batch_size))
    if show_progress_bar:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=desc, unit="batch", leave=False)
    out: np.ndarray | list | None = [None] * len(lengths) if rows_out else None

    def collect(rows: np.ndarray, result: Any) -> None:
        nonlocal out
        vectors = np.asarray(result, dtype=np.float32)[: len(rows)]
        if rows_out:
            for row, value in zip(rows, vectors, strict=True):
                out[row] = value
            return
        if out is None:
            out = np.zeros((len(lengths), vectors.shape[-1]), np.float32)
        out[rows] = vectors

    # One batch in flight: JAX dispatches `forward` asynchronously, so the next batch is
    # built while the device computes this one.
    pending: tuple[np.ndarray, Any] | None = None
    for start in starts:
        rows = order[start:start + int(batch_size)]
        width = round_up(max(int(lengths[rows].max()), 1), pad_multiple)
        if max_width is not None:
            width = min(width, int(max_width))
        result = forward(build_batch(rows, width))
        if pending is not None:
            collect(*pending)
        pending = (rows, result)
    if pending is not None:
        collect(*pending)
    global _encoded_rows
    _encoded_rows += len(lengths)
    if rows_out:
        return out
    return out if out is not None else np.zeros((0, 0), np.float32)


def token_batch_builder(tok, batch_size: int) -> BatchBuilder:
    """``build_batch`` over tokenised texts (``data_pipelines.tokenization.TokenizedTexts``).

    Returns ``(input_ids, attention_mask, token_type_ids)``, each ``[batch_size, width]``
    int32; rows past the real ones are all padding.
    """

    def build(rows: np.ndarray, width: int):
        ids = tok.input_ids[rows, :width]
        types = tok.token_type_ids[rows, :width]
        mask = (np.arange(width)[None, :] < tok.lengths[rows, None]).astype(np.int32)
        pad = int(batch_size) - len(rows)
        if pad:
            ids, mask, types = (np.pad(x, ((0, pad), (0, 0))) for x in (ids, mask, types))
        return ids, mask, types

    return build


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list, checked the same way for every model.

    Raises:
      TypeError: a single string instead of a list, or a non-string item.
      ValueError: an empty or whitespace-only text (its index is given).
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("encode takes a list of texts, not a single string: encode([text])")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise ValueError(f"text {i} is empty or whitespace only: {text!r}")
    return texts


class Encoder:
    """A loaded model that turns texts into vectors; subclasses implement :meth:`_encode`
    and declare their :attr:`views` for export (``embedding_core.serving``).

    Attributes:
      name: the model's name in exports and tables (``DualCSE-cross``).
      config: the run's config (``ml_collections.ConfigDict``).
      step: the checkpoint step (``None`` for an untrained model or in-memory params).
      dim: the width of the vectors :meth:`encode` returns.
      views: ``serving.View`` s, one export folder each.
      default_normalize: whether exports are unit rows unless told otherwise.
    """

    name: str = "encoder"
    config: Any = None
    step: int | None = None
    default_batch_size: int = 32
    default_normalize: bool = False
    views: tuple = ()

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def view_dim(self, view: str) -> int:
        """Width of ``view``'s vectors (default :attr:`dim`)."""
        return self.dim

    def export_meta(self) -> dict[str, Any]:
        """``meta.json`` entries shared by every view of an export."""
        return {}

    def table(self, view: str, normalize: bool):
        """``(num_rows, iterator of (ids, [rows, dim] float32))`` of a table view."""
        raise NotImplementedError(f"{self.name} holds no rows of view {view!r}")

    def hf_folders(self) -> list:
        """``serving.HFFolder`` s for export-hf; raises ValueError when there is none."""
        raise ValueError(f"{self.name} has no sentence-transformers form")

    def write_hf_files(self, stage) -> None:
        """Extra files export-hf writes into the staged output folder (default none)."""

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool,
                **kwargs: Any) -> np.ndarray:
        """``[len(texts), dim]`` raw vectors of non-empty, checked texts."""
        raise NotImplementedError

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               normalize: bool = False, show_progress_bar: bool = False,
               **kwargs: Any) -> np.ndarray:
        """Encodes texts into one float32 ``[len(texts), dim]`` array; row i = texts[i].

        Args:
          batch_size: texts per encoder call (default: the run's ``eval_batch_size``).
          normalize: scale rows to unit L2 norm (then dot product = cosine).
          **kwargs: the model's own choice of view (DualCSE ``kind``, MRWE ``side``).

        Raises:
          TypeError, ValueError: see :func:`check_texts`; ``batch_size`` < 1.
        """
        texts = check_texts(texts)
        if not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        if batch_size is None:
            batch_size = self.default_batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        # Rows are padded up to the batch size (one compile per width): never pad past the
        # texts there are, so a large batch_size costs no memory on a short list.
        batch_size = min(int(batch_size), max(len(texts), 1))
        if not texts:
            out = np.zeros((0, self.dim), np.float32)
        else:
            out = np.asarray(self._encode(texts, batch_size=batch_size,
                                          show_progress_bar=bool(show_progress_bar),
                                          **kwargs), dtype=np.float32)
        return l2_normalize(out) if normalize else out
