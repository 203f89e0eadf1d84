"""``embedding-jax index``: a faiss or usearch index of an export, written atomically, and its
recall@10 against exact search on a sample of the export's own rows
(``docs/quantization.md``, "Indexes"). faiss and usearch are the optional extra ``index``,
imported only here and only when used."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedding_core.serving import quantize
from embedding_core.storage import files, storage

KINDS = ("flat", "ivf", "hnsw", "binary-flat", "usearch")
K = 10  # recall@K
_USEARCH_METRIC = {"cosine": "cos", "dot": "ip", "euclidean": "l2sq"}


def _extra(module: str) -> Any:
    """``import module``; ImportError in one line naming the extra when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        package = "faiss-cpu" if module == "faiss" else "usearch"
        raise ImportError(f"{package} is not installed; `pip install 'embedding-jax[index]'` "
                          "(the optional extra `index`)") from None


def sample_rows(num_rows: int, count: int, seed: int) -> np.ndarray:
    """The query rows: ``sort(default_rng(seed).choice(num_rows, min(count, num_rows),
    replace=False))``, int64."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_rows, size=min(count, num_rows), replace=False)).astype(np.int64)


def prepare(rows: np.ndarray, similarity: str) -> np.ndarray:
    """float32 rows as the index holds them: unit length for ``cosine`` (inner product is
    then cosine), as they are for ``dot`` and ``euclidean``."""
    out = np.asarray(rows, np.float32)
    if similarity == "cosine":
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(out)


def exact_top(queries: np.ndarray, rows: np.ndarray, similarity: str, k: int = K,
              block_rows: int = quantize.BLOCK_ROWS) -> np.ndarray:
    """int64 ``[n_queries, min(k, n)]`` ids of the exact nearest rows (numpy brute force):
    largest dot product (``cosine``/``dot``, rows from :func:`prepare`) or smallest squared
    distance (``euclidean``); ties to the lower id (scores rounded to float32)."""
    q = np.asarray(queries, np.float64)
    best = np.zeros((len(q), 0), np.uint64)
    for a in range(0, len(rows), block_rows):
        block = np.asarray(rows[a:a + block_rows], np.float64)
        scores = q @ block.T
        if similarity == "euclidean":  # -|q - x|^2 up to the per-query |q|^2
            scores = 2 * scores - (block * block).sum(1)[None, :]
        ids = np.arange(a, a + len(block), dtype=np.int64)
        best = quantize._smallest(np.concatenate(
            [best, quantize._float_keys(scores, ids)], axis=1), min(k, len(rows)))
    return (best & np.uint64(0xFFFFFFFF)).astype(np.int64)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of ``|found[:k] & exact| / |exact|`` (ids < 0, padding, ignored)."""
    hits = [len(set(f[f >= 0].tolist()) & set(e.tolist())) / len(e)
            for f, e in zip(found[:, :exact.shape[1]], exact, strict=True)]
    return float(np.mean(hits))


def build(kind: str, vectors: np.ndarray, similarity: str, args: argparse.Namespace) -> Any:
    """The faiss index (or usearch ``Index``) of ``kind`` holding ``vectors``: float32 rows
    (:func:`prepare`), or uint8 sign bytes for ``binary-flat`` and a binary ``usearch``."""
    n, width = vectors.shape
    if kind == "usearch":
        from_bits = vectors.dtype == np.uint8
        Index = _extra("usearch.index").Index
        index = Index(ndim=width * 8 if from_bits else width,
                      metric="hamming" if from_bits else _USEARCH_METRIC[similarity],
                      dtype="b1" if from_bits else "f32", connectivity=args.M,
                      expansion_add=args.ef_construction, expansion_search=args.ef_search)
        index.add(np.arange(n), vectors)
        return index
    faiss = _extra("faiss")
    if kind == "binary-flat":
        index = faiss.IndexBinaryFlat(width * 8)
        index.add(vectors)
        return index
    metric = faiss.METRIC_L2 if similarity == "euclidean" else faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlat(width, metric)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(width, args.M, metric)
        index.hnsw.efConstruction = args.ef_construction
        index.hnsw.efSearch = args.ef_search
    else:  # ivf: k-means wants ~39 rows a list; nlist beyond that only warns and degrades
        nlist = args.nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))
        if nlist > n:
            raise ValueError(f"--nlist={nlist} exceeds the {n} rows of the export")
        index = faiss.IndexIVFFlat(faiss.IndexFlat(width, metric), width, nlist, metric)
        index.train(vectors)
        index.nprobe = min(args.nprobe, nlist)
    index.add(vectors)
    return index


def search(index: Any, kind: str, queries: np.ndarray, k: int) -> np.ndarray:
    """int64 ``[n_queries, k]`` ids the index finds (-1: fewer than k)."""
    if kind == "usearch":
        matches = index.search(queries, k)
        keys = np.atleast_2d(np.asarray(matches.keys, np.int64))
        counts = np.reshape(getattr(matches, "counts", keys.shape[1]), (-1, 1))
        return np.where(np.arange(keys.shape[1]) < counts, keys, -1)
    return np.asarray(index.search(queries, k)[1], np.int64)


def save(index: Any, kind: str, output: str) -> None:
    """Writes the index to ``output`` (local or ``gs://``) atomically: a temporary file in
    the same folder renamed over it, or one upload; nothing is left on failure."""
    out = storage.as_path(output)
    remote = storage.is_remote(out)
    if not remote:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="embedding_jax_index.") if remote else str(Path(out).parent)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if kind == "usearch":
            index.save(tmp)
        elif kind == "binary-flat":
            _extra("faiss").write_index_binary(index, tmp)
        else:
            _extra("faiss").write_index(index, tmp)
        if remote:
            storage.upload(tmp, out)
        else:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600: others may read an index
            os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
        if remote:
            shutil.rmtree(folder, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def rescored(index: Any, kind: str, codes: np.ndarray, queries: np.ndarray,
             multiplier: int) -> np.ndarray:
    """int64 ``[n_queries, K]`` ids: the index's ``K * multiplier`` nearest sign codes of
    each query, rescored as float query . bits (sentence-transformers' recipe); ties to
    the lower id."""
    cand = search(index, kind, np.packbits(queries > 0, axis=-1), K * multiplier)
    bits = np.unpackbits(codes[np.maximum(cand, 0).ravel()], axis=-1)[:, :queries.shape[1]]
    scores = np.einsum("ij,ikj->ik", queries, bits.reshape(*cand.shape, -1).astype(int))
    scores = np.where(cand >= 0, scores, -np.inf)  # padding never outranks a candidate
    order = np.lexsort((cand, -scores), axis=1)[:, :K]
    return np.take_along_axis(cand, order, 1)


def make_index(args: argparse.Namespace) -> tuple[float, int, str, float | None]:
    """Builds, writes and measures the index; returns ``(recall@10, queries, exact source,
    recall@10 after rescoring or None)``. Raises FileNotFoundError, ImportError, ValueError:
    one line naming the file or flag."""
    if args.kind not in KINDS:
        raise ValueError(f"unknown --kind={args.kind!r}; use one of {', '.join(KINDS)}")
    files.check_not_an_input(args.output, {"--input": args.input, "--float": args.float})
    out = storage.as_path(args.output)
    if out.is_dir():
        raise IsADirectoryError(f"--output={storage.display(args.output)} is a folder; name "
                                "the index file")
    _extra("usearch.index" if args.kind == "usearch" else "faiss")  # before any work
    meta = quantize.one_view(args.input)[2]
    precision = meta.get("precision", "float32")
    if precision in quantize.BINARY and args.kind in ("binary-flat", "usearch"):
        codes, ids, meta, _ = quantize.read_quantized(args.input, mmap_mode="r")
        if not args.float:
            raise ValueError(f"--kind={args.kind} of the {precision} export {args.input} needs "
                             "--float=EXPORT (its float embeddings) for the exact search")
        rows, float_ids, float_meta = quantize.float_view(args.float, "--float")
        if float_ids != ids or rows.shape[1] != meta["dim"]:
            raise ValueError(f"--float={storage.display(args.float)}: its {len(float_ids)} rows "
                             f"of dimension {rows.shape[1]} are not those of {args.input}")
        vectors = np.ascontiguousarray(np.asarray(codes).view(np.uint8) ^ (
            np.uint8(0x80) if precision == "binary" else np.uint8(0)))
        exact_from, similarity = args.float, float_meta.get("similarity", "cosine")
        binary = True
    elif precision != "float32":
        raise ValueError(f"--input={args.input} is a {precision} export; --kind={args.kind} "
                         "needs float embeddings (binary-flat and usearch also take "
                         "binary/ubinary codes)")
    elif args.kind == "binary-flat":
        raise ValueError(f"--kind=binary-flat needs a binary/ubinary export; {args.input} is "
                         "float (embedding-jax quantize --precision=ubinary first)")
    else:
        rows, ids, meta = quantize.float_view(args.input)
        similarity = meta.get("similarity", "cosine")
        vectors, exact_from, binary = prepare(rows, similarity), args.input, False
    if len(ids) == 0 or not np.isfinite(rows).all():
        where = exact_from if binary else args.input
        raise ValueError(f"{storage.display(where)}: " + ("no rows" if len(ids) == 0 else
                         f"row {int(np.argwhere(~np.isfinite(rows))[0, 0])} holds NaN or "
                         "infinite values"))
    floats = prepare(rows, similarity)
    index = build(args.kind, vectors, similarity, args)
    # Measured before it is written: a failure leaves no index (nor replaces one).
    sample = sample_rows(len(ids), args.queries, args.seed)
    found = search(index, args.kind, vectors[sample], K)
    exact = exact_top(floats[sample], floats, similarity)
    again = recall(rescored(index, args.kind, vectors, floats[sample], args.rescore_multiplier),
                   exact) if binary else None
    save(index, args.kind, args.output)
    return recall(found, exact), len(sample), exact_from, again


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax index",
        description="A faiss (flat, ivf, hnsw, binary-flat) or usearch index of an export, "
                    "and its recall@10 against exact numpy search on a sample of its rows.")
    p.add_argument("--input", required=True, help="export folder: float, or binary/ubinary "
                   "for binary-flat and usearch")
    p.add_argument("--output", required=True, help="index file (local or gs://)")
    p.add_argument("--kind", required=True, help=" | ".join(KINDS))
    p.add_argument("--float", default=None,
                   help="binary inputs: the float export of the same rows (exact search)")
    p.add_argument("--nlist", type=int, default=0,
                   help="ivf lists (0: min(4 sqrt(n), n / 39))")
    p.add_argument("--nprobe", type=int, default=8, help="ivf lists searched")
    p.add_argument("--M", type=int, default=32, help="hnsw/usearch neighbours per node")
    p.add_argument("--ef_construction", type=int, default=128, help="hnsw/usearch")
    p.add_argument("--ef_search", type=int, default=64, help="hnsw/usearch")
    p.add_argument("--rescore_multiplier", type=int, default=4,
                   help="binary inputs: candidates per result rescored with the float query")
    p.add_argument("--queries", type=int, default=1000, help="rows sampled as queries")
    p.add_argument("--seed", type=int, default=0, help="of the query sample")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``embedding-jax index ...``; the exit status (1 after one error line)."""
    args = parser().parse_args(argv)
    if min(args.nlist + 1, args.nprobe, args.M, args.ef_construction, args.ef_search,
           args.queries, args.rescore_multiplier) < 1 or args.seed < 0:
        print("embedding-jax index: error: --nlist and --seed must be >= 0, the other numbers "
              ">= 1", file=sys.stderr)
        return 2
    try:
        value, count, exact_from, again = make_index(args)
    except (OSError, ValueError, ImportError, RuntimeError) as err:  # faiss: RuntimeError
        print(f"embedding-jax index: error: {storage.describe_error(err)}".splitlines()[0],
              file=sys.stderr)
        return 1
    print(f"recall@{K} {value:.4f} over {count} queries ({args.kind} index {args.output}; "
          f"exact: numpy brute force over {exact_from})")
    if again is not None:
        print(f"recall@{K} {again:.4f} rescored ({K * args.rescore_multiplier} candidates a "
              "query, float query . sign bits)")
    return 0
