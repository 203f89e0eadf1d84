"""Quantized exports and quantized retrieval, as sentence-transformers'
``util.quantize_embeddings`` and ``semantic_search_faiss``/``_usearch`` (``rescore=True``)
do them (``docs/quantization.md``); numpy only. ``embedding-jax quantize`` is :func:`main`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from embedding_core.serving.export_reader import VIEW_ARRAY, load_export
from embedding_core.storage import storage

PRECISIONS = ("int8", "uint8", "binary", "ubinary")
SCALAR = ("int8", "uint8")
BINARY = ("binary", "ubinary")
CODE_DTYPE = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}
BLOCK_ROWS = 1 << 14  # rows per block when quantizing or scanning a corpus: bounds memory
# meta.json keys of the writer itself, and the view's tie to its own export's manifest.
_NOT_COPIED = ("format_version", "num_rows", "arrays", "ids_file", "created_utc", "export_id")

# (ids, float [b, dim]) blocks in row order, made afresh by each call (two passes).
Blocks = Callable[[], Iterable[tuple[Sequence[str], np.ndarray]]]


def check_precision(precision: str, *, allow_float: bool = False) -> str:
    """``precision`` itself. Raises ValueError: not one of :data:`PRECISIONS` (or float32)."""
    known = (("float32",) if allow_float else ()) + PRECISIONS
    if precision not in known:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(known)}")
    return precision


def code_dim(precision: str, dim: int) -> int:
    """Columns of the codes of ``dim``-wide floats: ``dim``, or ``ceil(dim / 8)`` bytes."""
    return -(-dim // 8) if check_precision(precision) in BINARY else dim


OWN_RANGES = "from the embeddings themselves"  # meta.json "calibration" without one


def _check_finite(rows: np.ndarray, what: str) -> None:
    """Raises ValueError naming the first row holding NaN or an infinity (its codes would be
    silent garbage)."""
    bad = ~np.isfinite(rows)
    if bad.any():
        raise ValueError(f"{what}: row {int(np.argwhere(bad)[0][0])} holds NaN or infinite "
                         "values")


def ranges_of(embeddings: np.ndarray | None = None,
              calibration: np.ndarray | None = None) -> np.ndarray:
    """float32 ``[2, dim]`` per-column (min, max) of ``calibration`` if given, else of
    ``embeddings`` (sentence-transformers' rule). Raises ValueError: a single row to
    calibrate on, or no rows."""
    source = embeddings if calibration is None else calibration
    source = np.asarray(source)
    if source.ndim != 2 or len(source) < (1 if calibration is not None else 2):
        raise ValueError(f"cannot compute quantization ranges from {len(source)} embedding(s) "
                         f"of shape {list(source.shape)}; give calibration embeddings")
    _check_finite(source, "the calibration embeddings" if calibration is not None else
                  "the embeddings")
    return np.vstack((np.min(source, axis=0), np.max(source, axis=0))).astype(np.float32)


def quantize_embeddings(embeddings: np.ndarray, precision: str,
                        ranges: np.ndarray | None = None,
                        calibration: np.ndarray | None = None) -> np.ndarray:
    """Codes of float ``[n, dim]`` embeddings: int8/uint8 ``[n, dim]`` (255 buckets of
    ``ranges``, by default :func:`ranges_of`), or packed sign bits ``[n, ceil(dim / 8)]``
    (uint8 ``ubinary``; ``binary``: minus 128, as int8). Raises ValueError: integer input,
    an unknown precision, ranges or calibration of another dimension."""
    check_precision(precision)
    embeddings = np.asarray(embeddings)
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ValueError(f"embeddings to quantize must be float, got {embeddings.dtype}")
    dim = embeddings.shape[-1]
    _check_finite(embeddings, "the embeddings")
    if precision in BINARY:
        bits = np.packbits(embeddings > 0, axis=-1)
        # int8 arithmetic on the uint8 codes: v - 128 wraps as in sentence-transformers.
        return (bits - 128).astype(np.int8) if precision == "binary" else bits
    if ranges is None:
        if calibration is not None and np.shape(calibration)[-1] != dim:
            raise ValueError(f"calibration embeddings have dimension {np.shape(calibration)[-1]}"
                             f", the embeddings {dim}")
        ranges = ranges_of(embeddings, calibration)
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    if ranges.shape != (2, dim):
        raise ValueError(f"ranges of shape {list(ranges.shape)}, expected [2, {dim}]")
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)  # a constant column: every value in bucket 0
    codes = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
    return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)


def dequantize(codes: np.ndarray, precision: str, ranges: np.ndarray) -> np.ndarray:
    """float64 bucket starts of int8/uint8 codes (what sentence-transformers rescores with)."""
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    steps = (ranges[1] - ranges[0]) / 255
    steps = np.where(steps == 0, 1, steps)
    out = np.asarray(codes).astype(np.float64)
    if precision == "int8":
        out += 128
    return out * steps + ranges[0]


def unpack_bits(codes: np.ndarray, precision: str, dim: int) -> np.ndarray:
    """uint8 0/1 ``[..., dim]`` of binary/ubinary codes (the padding bits dropped)."""
    raw = np.asarray(codes).view(np.uint8)
    if precision == "binary":
        raw = raw ^ np.uint8(0x80)  # undoes the -128 offset: the same bytes as ubinary
    return np.unpackbits(raw, axis=-1)[..., :dim]


def _smallest(keys: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` smallest int64 keys of each row, ascending (keys are unique per row)."""
    if keys.shape[1] > k:
        keys = np.take_along_axis(keys, np.argpartition(keys, k - 1, axis=1)[:, :k], axis=1)
    return np.sort(keys, axis=1)


def _float_keys(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """uint64 keys ascending in (-float32(score), id): order-preserving bits on top."""
    bits = (scores.astype(np.float32) + np.float32(0)).view(np.uint32)  # -0.0 ties +0.0
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    return ((~ordered).astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)[None, :]


def search(queries: np.ndarray, corpus: np.ndarray, precision: str, top_k: int = 10, *,
           rescore: bool = True, rescore_multiplier: int = 2, ranges: np.ndarray | None = None,
           rescore_with: np.ndarray | None = None, rescore_precision: str = "float32",
           rescore_ranges: np.ndarray | None = None, block_rows: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores float64, ids int64)``, each ``[n_queries, min(top_k, n)]``, best first, of
    float ``[n_queries, dim]`` queries over an ``[n, ...]`` corpus of ``precision`` codes.

    Candidates: the ``top_k * rescore_multiplier`` nearest by Hamming distance (binary) or
    by the dot of the query's codes (int8/uint8, quantized with ``ranges``); float32: the
    exact dot product. With ``rescore``, each candidate is scored as query . unpacked bits
    or dequantized codes (sentence-transformers' recipe), or as query . the same rows of
    ``rescore_with`` (float32, or ``rescore_precision`` codes of ``rescore_ranges``: the
    binary-search, int8-rescore recipe of sentence-transformers' quantized-retrieval demo);
    without, ``-hamming`` or the code dot. Ties go to the lower id (float32: among scores
    rounded to float32). Raises ValueError: shapes, precision, missing ranges."""
    check_precision(precision, allow_float=True)
    queries = np.asarray(queries)
    if queries.ndim != 2 or not np.issubdtype(queries.dtype, np.floating):
        raise ValueError(f"queries must be float [n_queries, dim], got {queries.dtype} "
                         f"{list(queries.shape)}")
    dim, n = queries.shape[1], len(corpus)
    width = dim if precision == "float32" else code_dim(precision, dim)
    if corpus.ndim != 2 or corpus.shape[1] != width:
        raise ValueError(f"a {precision} corpus for {dim}-wide queries has {width} columns, "
                         f"got shape {list(corpus.shape)}")
    if precision in SCALAR and ranges is None:
        raise ValueError(f"a {precision} corpus needs the ranges it was quantized with "
                         "(meta.json 'ranges')")
    if top_k < 1 or rescore_multiplier < 1 or n == 0:
        raise ValueError(f"top_k={top_k} and rescore_multiplier={rescore_multiplier} must be "
                         f">= 1, and the corpus non-empty ({n} rows)")
    rescore = rescore and precision != "float32"
    if rescore_with is not None:
        check_precision(rescore_precision, allow_float=True)
        if rescore_precision in BINARY or len(rescore_with) != n or \
                np.shape(rescore_with)[1] != dim or (rescore_precision in SCALAR
                                                     and rescore_ranges is None):
            raise ValueError(f"rescore_with: float or int8/uint8 (with rescore_ranges) rows "
                             f"[{n}, {dim}], got {rescore_precision} {list(rescore_with.shape)}")
    block_rows = block_rows or BLOCK_ROWS
    k = min(top_k, n)
    wanted = min(k * rescore_multiplier, n) if rescore else k
    if precision in BINARY:
        q = unpack_bits(quantize_embeddings(queries, "ubinary"), "ubinary", dim)
        q = q.astype(np.float32)
    elif precision in SCALAR:
        q = quantize_embeddings(queries, precision, ranges).astype(np.float64)
    else:
        q = queries.astype(np.float64)
    best = np.zeros((len(q), 0), np.uint64 if precision == "float32" else np.int64)
    for a in range(0, n, block_rows):
        block = np.asarray(corpus[a:a + block_rows])
        ids = np.arange(a, a + len(block), dtype=np.int64)
        if precision in BINARY:
            c = unpack_bits(block, precision, dim).astype(np.float32)
            # |q xor c| = |q| + |c| - 2 q.c, exact in float32 for dim < 2**24.
            hamming = (q.sum(1)[:, None] + c.sum(1)[None, :] - 2 * (q @ c.T)).astype(np.int64)
            keys = hamming * n + ids[None, :]
        elif precision in SCALAR:  # integer dot products, exact in float64
            keys = -np.rint(q @ block.astype(np.float64).T).astype(np.int64) * n + ids[None, :]
        else:
            keys = _float_keys(q @ block.astype(np.float64).T, ids)
        best = _smallest(np.concatenate([best, keys], axis=1), wanted)
    if precision == "float32":
        found = (best & np.uint64(0xFFFFFFFF)).astype(np.int64)
        vectors = np.asarray(corpus[found.ravel()]).astype(np.float64)
        return np.einsum("ij,ikj->ik", q, vectors.reshape(*found.shape, dim)), found
    found, primary = best % n, best // n
    if not rescore:
        return (-primary).astype(np.float64), found
    cand = np.asarray(corpus[found.ravel()]).reshape(*found.shape, width)
    if rescore_with is not None:
        cand = np.asarray(rescore_with[found.ravel()]).reshape(*found.shape, dim)
        cand = cand.astype(np.float64) if rescore_precision == "float32" else \
            dequantize(cand, rescore_precision, rescore_ranges)
    elif precision in BINARY:
        cand = unpack_bits(cand, precision, dim).astype(int)
    else:
        cand = dequantize(cand, precision, ranges)
    scores = np.einsum("ij,ikj->ik", queries, cand).astype(np.float64, copy=False)
    order = np.lexsort((found, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(found, order, 1)


def streamed_ranges(blocks: Iterable[tuple[Sequence[str], np.ndarray]]) -> np.ndarray:
    """:func:`ranges_of` of all the rows of float blocks, one block in memory at a time."""
    low = high = None
    rows = 0
    for _, block in blocks:
        block = np.asarray(block)
        rows += len(block)
        lo, hi = np.min(block, axis=0), np.max(block, axis=0)
        low = lo if low is None else np.minimum(low, lo)
        high = hi if high is None else np.maximum(high, hi)
    if rows < 2:
        raise ValueError(f"cannot compute quantization ranges from {rows} embedding(s); give "
                         "--calibration")
    return np.vstack((low, high)).astype(np.float32)


def load_calibration(path: str | os.PathLike, dim: int) -> tuple[np.ndarray, str]:
    """float32 ``[2, dim]`` ranges from ``path``: a ``.npy`` of float calibration embeddings
    ``[n, dim]``, a float export (its rows), or an int8/uint8 export (its stored ranges).
    Returns ``(ranges, what they came from)``. Raises FileNotFoundError, ValueError (both
    naming ``path``): a missing file, another dimension, a binary export, integer rows."""
    where = storage.display(path)
    p = storage.as_path(path)
    if p.is_file():
        try:
            with p.open("rb") as f:
                rows = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"--calibration={where}: not a .npy file ({err})") from None
        meta: dict[str, Any] = {}
    elif p.is_dir():
        rows, _, meta = one_view(path, "--calibration")
    else:
        raise FileNotFoundError(f"--calibration={where} does not exist")
    precision = meta.get("precision", "float32")
    if precision in SCALAR:  # another quantized export: reuse its buckets
        ranges = np.asarray(meta.get("ranges"), np.float32)
        got = int(meta.get("dim", -1))
        what = f"those stored in {where}"
    elif precision in BINARY:
        raise ValueError(f"--calibration={where} is a {precision} export: it has no ranges; "
                         "give float embeddings or an int8/uint8 export")
    else:
        if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.floating) or len(rows) < 1:
            raise ValueError(f"--calibration={where}: expected float [n, {dim}] embeddings, "
                             f"got {rows.dtype} {list(rows.shape)}")
        got, ranges = rows.shape[1], None
        what = f"from {len(rows):,} calibration rows of {where}"
    if got != dim:
        raise ValueError(f"--calibration={where} has dimension {got}, the embeddings {dim}")
    try:
        return (ranges_of(calibration=rows) if ranges is None else ranges), what
    except ValueError as err:
        raise ValueError(f"--calibration={where}: {err}") from None


def write_quantized(out_dir: str | os.PathLike, blocks: Blocks, num_rows: int, dim: int,
                    precision: str, meta: Mapping[str, Any],
                    ranges: np.ndarray | None = None, calibration: str | None = None) -> dict:
    """Writes float blocks as a ``precision`` export of ``VIEW_ARRAY`` codes (int8/uint8
    ``[num_rows, code_dim]``), ``ids.txt`` and ``meta.json`` holding ``precision``, ``dim``
    and, for int8/uint8, ``ranges`` ``[2, dim]``, ``starts`` and ``steps``; atomic (the
    ``EmbeddingWriter``: nothing new left on failure). Without ``ranges`` int8/uint8 take
    them from the blocks (one extra pass). Returns the meta written. Raises ValueError."""
    from embedding_core.serving.embedding_writer import EmbeddingWriter

    check_precision(precision)
    if precision in SCALAR:
        if ranges is None:
            ranges, calibration = streamed_ranges(blocks()), OWN_RANGES
        ranges = np.asarray(ranges, np.float32)
        if ranges.shape != (2, dim):
            raise ValueError(f"ranges of shape {list(ranges.shape)}, expected [2, {dim}]")
    else:
        ranges, calibration = None, None  # sign bits need no ranges
    info: dict[str, Any] = {"precision": precision, "dim": int(dim), "ranges": None,
                            "starts": None, "steps": None, "calibration": calibration}
    if ranges is not None:
        steps = (ranges[1] - ranges[0]) / 255
        info.update(ranges=ranges.tolist(), starts=ranges[0].tolist(),
                    steps=np.where(steps == 0, 1, steps).astype(np.float32).tolist())
    full = {k: v for k, v in meta.items() if k not in _NOT_COPIED}
    full.update(info)
    writer = EmbeddingWriter(out_dir, {VIEW_ARRAY: code_dim(precision, dim)}, num_rows,
                             CODE_DTYPE[precision], meta=full)
    with writer:
        start = 0
        for ids, block in blocks():
            block = np.asarray(block)
            bad = ~np.isfinite(block)
            if bad.any():  # named by its row in the whole input, not in the block
                row = int(np.argwhere(bad)[0][0])
                raise ValueError(f"row {start + row} (id {ids[row]}) of the embeddings holds "
                                 "NaN or infinite values")
            writer.write(start, {VIEW_ARRAY: quantize_embeddings(block, precision, ranges)},
                         ids)
            start += len(ids)
    return full


def one_view(path: str | os.PathLike, flag: str = "--input", mmap_mode: str | None = "r"
             ) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """``(rows, ids, meta)`` of an export of one view (or the view folder itself).
    Raises FileNotFoundError, ValueError: several views; both naming ``flag=path``."""
    where = storage.display(path)
    if not storage.as_path(path).exists():
        raise FileNotFoundError(f"{flag}={where} does not exist")
    views = load_export(path, mmap_mode=mmap_mode)
    if len(views) != 1:
        raise ValueError(f"{flag}={where} holds the views {sorted(views)}; name one "
                         f"({flag}={where}/VIEW)")
    return next(iter(views.values()))


def read_quantized(path: str | os.PathLike, mmap_mode: str | None = None,
                   flag: str = "--input"
                   ) -> tuple[np.ndarray, list[str], dict[str, Any], np.ndarray | None]:
    """``(codes, ids, meta, ranges float32 [2, dim] or None)`` of a quantized export
    (:func:`one_view`). Raises FileNotFoundError; ValueError: not quantized, fields that
    disagree with the codes."""
    codes, ids, meta = one_view(path, flag, mmap_mode)
    where = storage.display(path)
    precision = meta.get("precision", "float32")
    if precision not in PRECISIONS:
        raise ValueError(f"{flag}={where}: not a quantized export (precision {precision!r})")
    dim = int(meta.get("dim", 0))
    if codes.shape[1] != code_dim(precision, max(dim, 1)) or codes.dtype != CODE_DTYPE[precision]:
        raise ValueError(f"{flag}={where}: {codes.dtype} codes of width {codes.shape[1]} disagree"
                         f" with meta.json precision {precision!r}, dim {dim}")
    ranges = None
    if precision in SCALAR:
        ranges = np.asarray(meta.get("ranges"), np.float32)
        if ranges.shape != (2, dim):
            raise ValueError(f"{flag}={where}: meta.json 'ranges' of shape "
                             f"{list(ranges.shape)}, expected [2, {dim}]")
    return codes, ids, meta, ranges


def float_view(path: str | os.PathLike, flag: str = "--input", mmap_mode: str | None = "r"
               ) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """``(embeddings, ids, meta)`` of a float export (:func:`one_view`). Raises
    FileNotFoundError; ValueError: several views, a quantized export."""
    rows, ids, meta = one_view(path, flag, mmap_mode)
    precision = meta.get("precision", "float32")
    if precision != "float32" or not np.issubdtype(rows.dtype, np.floating):
        raise ValueError(f"{flag}={storage.display(path)} is a {precision} export, not float "
                         "embeddings")
    return rows, ids, meta


def array_blocks(rows: np.ndarray, ids: Sequence[str], block_rows: int | None = None
                 ) -> Blocks:
    """:data:`Blocks` of an (memory-mapped) array and its ids (default :data:`BLOCK_ROWS`)."""
    block_rows = block_rows or BLOCK_ROWS

    def blocks() -> Iterator[tuple[Sequence[str], np.ndarray]]:
        for a in range(0, len(rows), block_rows):
            yield ids[a:a + block_rows], np.asarray(rows[a:a + block_rows])
    return blocks


def quantize_export(input_dir: str, output_dir: str, precision: str,
                    calibration: str | None = None) -> dict[str, Any]:
    """``embedding-jax quantize``: a float export into a quantized one; returns its meta.
    Raises FileNotFoundError, ValueError (one line, naming the file)."""
    check_precision(precision)
    rows, ids, meta = float_view(input_dir)
    same = storage.display(input_dir).rstrip("/") == storage.display(output_dir).rstrip("/")
    if same:
        raise ValueError(f"--output={output_dir} is the input export; give another folder")
    out = storage.as_path(output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output={storage.display(output_dir)} is a file")
    ranges = what = None
    if calibration and precision not in SCALAR:
        raise ValueError(f"--calibration sets int8/uint8 ranges; --precision={precision} has "
                         "none")
    if calibration:
        ranges, what = load_calibration(calibration, rows.shape[1])
    return write_quantized(output_dir, array_blocks(rows, ids), len(ids), rows.shape[1],
                           precision, meta, ranges, what)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax quantize",
        description="A float export as int8/uint8 codes or packed sign bits "
                    "(sentence-transformers' quantize_embeddings); docs/quantization.md.")
    p.add_argument("--input", required=True, help="float export folder (local or gs://)")
    p.add_argument("--output", required=True, help="new export folder (local or gs://)")
    p.add_argument("--precision", required=True, help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--calibration", default=None,
                   help="int8/uint8 ranges from: a .npy of float embeddings, a float export, "
                        "or an int8/uint8 export's stored ranges (default: the input itself)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``embedding-jax quantize ...``; the exit status (1 after one error line)."""
    args = parser().parse_args(argv)
    try:
        meta = quantize_export(args.input, args.output, args.precision, args.calibration)
    except (OSError, ValueError) as err:
        print(f"embedding-jax quantize: error: {storage.describe_error(err)}", file=sys.stderr)
        return 1
    print(f"wrote {args.precision} codes of {meta['dim']}-wide embeddings into {args.output}"
          + (f" (ranges: {meta['calibration']})" if meta["calibration"] else ""),
          file=sys.stderr)
    return 0
