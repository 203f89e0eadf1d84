"""The one inference layer: pooling, the length-sorted encode loop and the ``Encoder`` base.

Every loaded model is an :class:`Encoder` whose ``encode`` returns what
``SentenceTransformer.encode`` returns (a list: float32 ``[N, dim]``; one string: ``[dim]``;
``precision``: other dtypes); texts run longest first, each batch padded to its length
bucket (:func:`bucket_width`: a few compiled widths, padding within 1/8 of the longest
text; docs/performance.md).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from embedding_core.errors import check_texts

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


# Called with each batch's row count once its vectors are on the host (bulk encoding's
# progress: a block is one encode call, and one call may run for half an hour).
_batch_done: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "batch_done", default=None)


@contextlib.contextmanager
def on_batch_done(callback: Callable[[int], None]) -> Iterator[None]:
    """Inside the ``with``, :func:`encode_in_batches` calls ``callback(rows)`` after each
    batch (``rows``: the batch's real texts), in this thread and context only."""
    token = _batch_done.set(callback)
    try:
        yield
    finally:
        _batch_done.reset(token)


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-int(n) // int(multiple)) * int(multiple)


# Token slots computed / real tokens, summed over this process's encode_in_batches calls.
_token_slots = 0
_real_tokens = 0


def token_slot_counts() -> tuple[int, int]:
    """``(slots, real)`` summed over this process's :func:`encode_in_batches` calls so far:
    the positions the model computed (``batch_size x width`` per batch, padding rows of a
    last short batch included) and the texts' own lengths. ``slots / real`` is the padding
    overhead (the benchmark's ``padding_jax``)."""
    return _token_slots, _real_tokens


def bucket_width(n: int, per_octave: int = 8, multiple: int = 1) -> int:
    """The padded width of a batch whose longest text is ``n``: ``n`` itself below
    ``2 * per_octave``, above it ``per_octave`` evenly spaced widths per doubling, i.e.
    ``n`` rounded up to a multiple of ``max(2**floor(log2 n) // per_octave, multiple)``.

    Padding is below ``1 / per_octave`` of ``n`` and at most ``per_octave`` widths compile
    per doubling of the length (25 widths, 1.07 slots per token on 5,000 INLI sentences
    at batch 64; docs/performance.md). E.g. ``per_octave=8``: 13 -> 13, 17 -> 18,
    33 -> 36, 65 -> 72, 129 -> 144.

    Raises:
      ValueError: ``per_octave`` or ``multiple`` below 1.
    """
    if int(per_octave) < 1 or int(multiple) < 1:
        raise ValueError(f"per_octave ({per_octave}) and multiple ({multiple}) must be >= 1")
    n = max(int(n), 1)
    step = (1 << (n.bit_length() - 1)) // int(per_octave)
    return round_up(n, max(step, int(multiple), 1))


def encode_in_batches(
    lengths: np.ndarray,
    build_batch: BatchBuilder,
    forward: Forward,
    *,
    batch_size: int,
    pad_multiple: int = 1,
    per_octave: int = 8,
    max_width: int | None = None,
    show_progress_bar: bool = False,
    desc: str = "encode",
    rows_out: bool = False,
) -> np.ndarray | list[np.ndarray]:
    """Runs ``forward`` over texts sorted by length; returns rows in input order.

    The texts of one call are sorted longest first (a caller that streams a corpus calls it
    once per block: the block is the sorting window) and cut into batches of
    ``batch_size``; each batch is padded to :func:`bucket_width` of its longest text, so a
    handful of widths compile; the next batch is built while the device computes.

    Args:
      lengths: ``[N]`` int, each text's length in the unit ``build_batch`` pads.
      build_batch: :data:`BatchBuilder`; pads the rows to ``batch_size`` (one compile per
        width).
      pad_multiple, per_octave: the buckets (:func:`bucket_width`'s ``multiple`` and
        ``per_octave``); ``per_octave=1, pad_multiple=8`` gives multiples of 8 only.
      max_width: cap on the width (e.g. the tokenised array's width).
      rows_out: return each row's own result (``result[i]``) in a list, not one matrix.

    Returns:
      ``[N, dim]`` float32 (``[0, 0]`` for no texts), or N float32 arrays (``rows_out``).

    Raises:
      ValueError: ``batch_size``, ``pad_multiple`` or ``per_octave`` below 1.
    """
    if int(batch_size) < 1 or int(pad_multiple) < 1 or int(per_octave) < 1:
        raise ValueError(f"batch_size ({batch_size}), pad_multiple ({pad_multiple}) and "
                         f"per_octave ({per_octave}) must be >= 1")
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

    def collected(rows: np.ndarray, result: Any) -> None:
        collect(rows, result)
        hook = _batch_done.get()
        if hook is not None:
            hook(len(rows))

    # One batch in flight: JAX dispatches `forward` asynchronously, so the next batch is
    # built while the device computes this one.
    global _token_slots, _real_tokens
    pending: tuple[np.ndarray, Any] | None = None
    for start in starts:
        rows = order[start:start + int(batch_size)]
        longest = int(lengths[rows].max())
        width = bucket_width(longest, per_octave, pad_multiple)
        if max_width is not None:
            width = min(width, int(max_width))
        _token_slots += int(batch_size) * width
        _real_tokens += int(np.minimum(lengths[rows], width).sum())
        result = forward(build_batch(rows, width))
        if pending is not None:
            collected(*pending)
        pending = (rows, result)
    if pending is not None:
        collected(*pending)
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


class Encoder:
    """A loaded model that turns texts into vectors; subclasses implement :meth:`_encode`
    and declare their :attr:`views` for export (``embedding_core.serving.serving``).

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

    prompts: dict[str, str] = {}
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    # encode's truncate_dim when a call gives none (sentence-transformers' truncate_dim=).
    truncate_dim: int | None = None

    def encode(self, sentences: str | Sequence[str], prompt_name: str | None = None,
               prompt: str | None = None, batch_size: int | None = None,
               show_progress_bar: bool | None = None,
               output_value: str | None = "sentence_embedding", precision: str = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               device: str | None = None, normalize_embeddings: bool = False,
               truncate_dim: int | None = None, *, normalize: bool | None = None,
               **kwargs: Any) -> Any:
        """Encodes texts with ``SentenceTransformer.encode``'s arguments and results: a
        float32 ``[len(sentences), dim]`` array by default (row i = sentences[i]; one row,
        ``[dim]``, for a single string); ``embedding_core.serving.st_compat`` for the rest.

        Args:
          prompt_name, prompt: text prepended to every input (``prompt`` wins).
          batch_size: texts per encoder call (default: the run's ``eval_batch_size``).
          output_value: ``sentence_embedding``; where :attr:`token_outputs`:
            ``token_embeddings`` (a list of float32 ``[tokens_i, hidden]``, prompt and
            special tokens included) or ``None`` (a list of dicts of both, ``input_ids``
            and ``attention_mask``, each cut to the text's own tokens).
          precision: float32 | int8 | uint8 | binary | ubinary (calibrated on this call).
          convert_to_tensor: a ``jax.Array`` on ``device`` (a JAX platform name).
          truncate_dim: the first columns only (default :attr:`truncate_dim`).
          normalize_embeddings (alias ``normalize``): unit rows, after ``truncate_dim``.
          **kwargs: the model's own choice of view (DualCSE ``kind``, MRWE ``side``).

        Raises:
          TypeError, ValueError: see :func:`check_texts`; a bad argument value.
        """
        from embedding_core.serving import st_compat

        texts, single = st_compat.texts_of(sentences)
        texts = check_texts(texts)
        if truncate_dim is None:
            truncate_dim = self.truncate_dim
        if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(
                truncate_dim, (int, np.integer)) or truncate_dim < 1):
            raise ValueError(f"truncate_dim must be None or an int >= 1, got {truncate_dim!r}")
        if normalize is not None:
            normalize_embeddings = normalize
        if not isinstance(normalize_embeddings, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {normalize_embeddings!r}")
        if output_value not in ("sentence_embedding", "token_embeddings", None):
            raise ValueError(f"output_value {output_value!r}: use 'sentence_embedding', "
                             "'token_embeddings' or None")
        if output_value != "sentence_embedding" and not self.token_outputs:
            raise ValueError(f"{self.name} gives sentence embeddings only "
                             "(output_value='sentence_embedding')")
        if precision not in st_compat.PRECISIONS:
            raise ValueError(f"precision {precision!r}: use one of {st_compat.PRECISIONS}")
        st_compat.check_device(device)
        prefix = st_compat.resolve_prompt(self.prompts, prompt, prompt_name,
                                          self.default_prompt_name)
        texts = [prefix + t for t in texts] if prefix else texts
        if batch_size is None:
            batch_size = self.default_batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        # Rows are padded up to the batch size (one compile per width): never pad past the
        # texts there are, so a large batch_size costs no memory on a short list.
        batch_size = min(int(batch_size), max(len(texts), 1))
        if output_value != "sentence_embedding":
            return self._token_results(texts, single, output_value, batch_size=batch_size,
                                       show_progress_bar=bool(show_progress_bar),
                                       truncate_dim=truncate_dim,
                                       normalize=normalize_embeddings, **kwargs)
        if not texts:
            out = np.zeros((0, self.dim), np.float32)
        else:
            out = np.asarray(self._encode(texts, batch_size=batch_size,
                                          show_progress_bar=bool(show_progress_bar),
                                          **kwargs), dtype=np.float32)
        if truncate_dim is not None:
            out = out[:, :int(truncate_dim)]
        if normalize_embeddings:
            out = l2_normalize(out)
        return st_compat.finish(out, single=single, precision=precision,
                                convert_to_numpy=convert_to_numpy,
                                convert_to_tensor=convert_to_tensor, device=device)

    token_outputs = False  # whether _token_rows exists (output_value != sentence_embedding)

    def _token_rows(self, texts: list[str], *, batch_size: int, show_progress_bar: bool
                    ) -> list[dict[str, np.ndarray]]:
        """Per text: ``input_ids`` int32 ``[t]`` and ``token_embeddings`` float32 ``[t, h]``."""
        raise NotImplementedError

    def _token_results(self, texts: list[str], single: bool, output_value: str | None, *,
                       batch_size: int, show_progress_bar: bool, truncate_dim: int | None,
                       normalize: bool, **kwargs: Any) -> Any:
        # As sentence-transformers: precision and convert_to_* do not apply to token
        # outputs; normalize and truncate_dim apply to the sentence embedding only.
        rows = self._token_rows(texts, batch_size=batch_size,
                                show_progress_bar=show_progress_bar) if texts else []
        if output_value == "token_embeddings":
            out = [r["token_embeddings"] for r in rows]
        else:
            sentences = np.asarray(self._encode(texts, batch_size=batch_size,
                                                show_progress_bar=show_progress_bar,
                                                **kwargs), np.float32)
            if truncate_dim is not None:
                sentences = sentences[:, :int(truncate_dim)]
            if normalize:
                sentences = l2_normalize(sentences)
            out = [{**r, "attention_mask": np.ones_like(r["input_ids"]),
                    "sentence_embedding": s} for r, s in zip(rows, sentences, strict=True)]
        return out[0] if single else out

    query_kwargs: dict[str, Any] = {}
    document_kwargs: dict[str, Any] = {}

    def encode_query(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """:meth:`encode` for search queries: the ``query`` prompt when the model has one
        (sentence-transformers 5), and the model's query side (:attr:`query_kwargs`)."""
        return self._encode_side(sentences, "query", self.query_kwargs, kwargs)

    def encode_document(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """:meth:`encode` for the searched texts: the ``document`` prompt (or ``passage``,
        ``corpus``) when the model has one, and its document side (:attr:`document_kwargs`)."""
        return self._encode_side(sentences, "document", self.document_kwargs, kwargs)

    def _encode_side(self, sentences, side: str, side_kwargs: dict, kwargs: dict) -> Any:
        names = ("query",) if side == "query" else ("document", "passage", "corpus")
        if kwargs.get("prompt") is None and kwargs.get("prompt_name") is None:
            found = next((n for n in names if n in self.prompts), None)
            if found is not None:
                kwargs["prompt_name"] = found
        return self.encode(sentences, **{**side_kwargs, **kwargs})

    def similarity(self, a, b) -> np.ndarray:
        """``[n, m]`` similarities by :attr:`similarity_fn_name` (``st_compat.similarity``)."""
        from embedding_core.serving import st_compat

        return st_compat.similarity(a, b, self.similarity_fn_name)

    def similarity_pairwise(self, a, b) -> np.ndarray:
        """``[n]`` similarity of row i with row i (``st_compat.similarity_pairwise``)."""
        from embedding_core.serving import st_compat

        return st_compat.similarity_pairwise(a, b, self.similarity_fn_name)

    def get_sentence_embedding_dimension(self) -> int:
        """The width of :meth:`encode`'s rows, :attr:`truncate_dim` when set
        (sentence-transformers' name; its version 6 calls it ``get_embedding_dimension``,
        also here)."""
        return self.dim if self.truncate_dim is None else min(self.dim, self.truncate_dim)

    get_embedding_dimension = get_sentence_embedding_dimension

    @property
    def max_seq_length(self) -> int | None:
        """Tokens per text, special tokens included (settable: longer texts are cut)."""
        return None if self.config is None or "max_length" not in self.config \
            else int(self.config.max_length)

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        if self.config is None or "max_length" not in self.config:
            raise AttributeError(f"{self.name} has no token length to set")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
            raise ValueError(f"max_seq_length must be an int >= 2, got {value!r}")
        with self.config.unlocked() if hasattr(self.config, "unlocked") else \
                contextlib.nullcontext():
            self.config.max_length = int(value)
