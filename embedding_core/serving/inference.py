"""The one inference layer: pooling, the length-sorted encode loop and the ``Encoder`` base
whose ``encode`` is ``SentenceTransformer.encode`` (``docs/models.md``, "Encoding")."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from embedding_core.errors import check_texts

# (rows [b] int, width) -> model inputs padded to ``width`` and to the fixed batch size.
BatchBuilder = Callable[[np.ndarray, int], Any]
Forward = Callable[[Any], Any]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``[..., L, d]``, mask ``[..., L]`` -> ``[..., d]`` float32 mean of the real positions."""
    m = mask.astype(jnp.float32)[..., None]
    total = jnp.sum(x.astype(jnp.float32) * m, axis=-2)
    return total / jnp.maximum(jnp.sum(m, axis=-2), 1.0)


def l2_normalize(x: np.ndarray | jax.Array, eps: float = 1e-12):
    """Rows scaled to unit L2 norm (a zero row stays zero); numpy or jax."""
    xp = jnp if isinstance(x, jax.Array) else np
    norm = xp.linalg.norm(x, axis=-1, keepdims=True)
    return x / xp.maximum(norm, eps)


_encoded_rows = 0  # read by the multi-process tests: each process encodes only its slice


def encoded_rows() -> int:
    """Rows this process has passed through :func:`encode_in_batches`."""
    return _encoded_rows


# Bulk encoding's progress: one encode call may run for half an hour.
_batch_done: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "batch_done", default=None)


@contextlib.contextmanager
def on_batch_done(callback: Callable[[int], None]) -> Iterator[None]:
    """Inside the ``with`` (this context only), ``callback(rows)`` after each batch."""
    token = _batch_done.set(callback)
    try:
        yield
    finally:
        _batch_done.reset(token)


def round_up(n: int, multiple: int) -> int:
    return -(-int(n) // int(multiple)) * int(multiple)


_token_slots = 0
_real_tokens = 0


def token_slot_counts() -> tuple[int, int]:
    """``(slots, real)``: positions computed (``batch_size x width`` per batch) and real
    tokens over this process's :func:`encode_in_batches` calls (``padding_jax`` = ratio)."""
    return _token_slots, _real_tokens


def bucket_width(n: int, per_octave: int = 8, multiple: int = 1) -> int:
    """``n`` rounded up to a multiple of ``max(2**floor(log2 n) // per_octave, multiple)``:
    padding below ``1 / per_octave``, ``per_octave`` widths per doubling (8: 17 -> 18,
    129 -> 144; docs/performance.md). Raises ValueError: an argument below 1."""
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
    """``forward`` over batches of texts sorted longest first, each padded to
    :func:`bucket_width` (capped at ``max_width``) of its longest ``lengths`` ``[N]``.

    Returns ``[N, dim]`` float32 in input order (``[0, 0]`` for no texts), or a list of N
    rows (``rows_out``). Raises ValueError: an int argument below 1.
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
    """``build_batch`` of ``TokenizedTexts``: ids, mask, types ``[batch_size, width]`` int32."""

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
    """A loaded model; subclasses implement :meth:`_encode` and declare :attr:`views`
    (``serving.View`` s, one export folder each). ``step`` is ``None`` when untrained."""

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
        return self.dim

    def export_meta(self) -> dict[str, Any]:
        return {}  # meta.json entries shared by every view of an export

    def table(self, view: str, normalize: bool):
        """``(num_rows, iterator of (ids, [rows, dim] float32))`` of a table view."""
        raise NotImplementedError(f"{self.name} holds no rows of view {view!r}")

    def hf_folders(self) -> list:
        """``serving.HFFolder`` s for export-hf; raises ValueError when there is none."""
        raise ValueError(f"{self.name} has no sentence-transformers form")

    def write_hf_files(self, stage) -> None:
        """Extra files export-hf writes into the staged output folder."""

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
        """``SentenceTransformer.encode``: float32 ``[len(sentences), dim]`` (``[dim]`` for
        one string; ``docs/models.md``, "Encoding"); ``**kwargs`` pick the model's view.

        Raises: TypeError, ValueError: see :func:`check_texts`; a bad argument value."""
        from embedding_core.serving import st_compat

        texts, single = st_compat.texts_of(sentences)
        texts = check_texts(texts)
        if truncate_dim is None:
            truncate_dim = self.truncate_dim
        check_truncate_dim(truncate_dim)
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
        # Rows are padded up to the batch size: a large one costs no memory on a short list.
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
        out = _truncate_normalize(out, truncate_dim, normalize_embeddings)
        return st_compat.finish(out, single=single, precision=precision,
                                convert_to_numpy=convert_to_numpy,
                                convert_to_tensor=convert_to_tensor, device=device)

    token_outputs = False  # whether _token_rows exists (output_value != sentence_embedding)

    def _token_rows(self, texts: list[str], *, batch_size: int, show_progress_bar: bool
                    ) -> list[dict[str, np.ndarray]]:
        """Per text: ``input_ids`` int32 ``[t]``, ``token_embeddings`` float32 ``[t, h]``."""
        raise NotImplementedError

    def _token_results(self, texts: list[str], single: bool, output_value: str | None, *,
                       batch_size: int, show_progress_bar: bool, truncate_dim: int | None,
                       normalize: bool, **kwargs: Any) -> Any:
        rows = self._token_rows(texts, batch_size=batch_size,
                                show_progress_bar=show_progress_bar) if texts else []
        if output_value == "token_embeddings":
            out = [r["token_embeddings"] for r in rows]
        else:
            sentences = np.asarray(self._encode(texts, batch_size=batch_size,
                                                show_progress_bar=show_progress_bar,
                                                **kwargs), np.float32)
            sentences = _truncate_normalize(sentences, truncate_dim, normalize)
            out = [{**r, "attention_mask": np.ones_like(r["input_ids"]),
                    "sentence_embedding": s} for r, s in zip(rows, sentences, strict=True)]
        return out[0] if single else out

    query_kwargs: dict[str, Any] = {}
    document_kwargs: dict[str, Any] = {}

    def encode_query(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """:meth:`encode` with the ``query`` prompt, if any, and :attr:`query_kwargs`."""
        return self._encode_side(sentences, "query", self.query_kwargs, kwargs)

    def encode_document(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """:meth:`encode` with the ``document`` (``passage``, ``corpus``) prompt, if any,
        and :attr:`document_kwargs`."""
        return self._encode_side(sentences, "document", self.document_kwargs, kwargs)

    def _encode_side(self, sentences, side: str, side_kwargs: dict, kwargs: dict) -> Any:
        names = ("query",) if side == "query" else ("document", "passage", "corpus")
        if kwargs.get("prompt") is None and kwargs.get("prompt_name") is None:
            found = next((n for n in names if n in self.prompts), None)
            if found is not None:
                kwargs["prompt_name"] = found
        return self.encode(sentences, **{**side_kwargs, **kwargs})

    def similarity(self, a, b) -> np.ndarray:
        """``[n, m]`` similarities by :attr:`similarity_fn_name`."""
        from embedding_core.serving import st_compat

        return st_compat.similarity(a, b, self.similarity_fn_name)

    def similarity_pairwise(self, a, b) -> np.ndarray:
        """``[n]`` similarity of row i with row i."""
        from embedding_core.serving import st_compat

        return st_compat.similarity_pairwise(a, b, self.similarity_fn_name)

    def get_sentence_embedding_dimension(self) -> int:
        """The width of :meth:`encode`'s rows (:attr:`truncate_dim` when set)."""
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


def check_truncate_dim(truncate_dim: Any) -> None:
    """Raises ValueError unless ``truncate_dim`` is None or an int >= 1."""
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(
            truncate_dim, (int, np.integer)) or truncate_dim < 1):
        raise ValueError(f"truncate_dim must be None or an int >= 1, got {truncate_dim!r}")


def _truncate_normalize(
out: np.ndarray, truncate_dim: int | None, normalize: bool
                        ) -> np.ndarray:
    if truncate_dim is not None:
        out = out[:, :int(truncate_dim)]
    return l2_normalize(out) if normalize else out
