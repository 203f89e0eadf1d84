"""Exact top-k search of query vectors against an exported corpus, streamed from disk in
row chunks, each chunk split over the devices and ranked by
``embedding_core.losses.table_ranking.top_k`` (``docs/search.md``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from embedding_core.distributed import multihost
from embedding_core.losses import table_ranking
from embedding_core.serving import export_reader
from embedding_core.storage import storage

SCORES = ("cos", "dot")
CHUNK_ROWS = 1 << 16  # corpus rows a chunk: [chunk, dim] float32 on the host at a time
QUERY_BATCH = 1024  # queries ranked at once: [batch, row_block] scores a device
ROW_BLOCK = 8192  # rows a device scores at once: [1024, 8192] float32 = 32 MiB
_EPS = 1e-12  # torch.nn.functional.normalize's eps, as sentence-transformers' cos_sim


def _dot(q: jax.Array, rows: jax.Array, args: tuple, consts: tuple) -> jax.Array:
    # HIGHEST: a TPU's default matmul rounds inputs to bfloat16.
    return jnp.dot(q, rows.T, precision=jax.lax.Precision.HIGHEST)


def _cos(q: jax.Array, rows: jax.Array, args: tuple, consts: tuple) -> jax.Array:
    # Queries arrive unit-length; rows are normalised where they lie (zero rows score 0).
    norm = jnp.maximum(jnp.linalg.norm(rows, axis=1, keepdims=True), _EPS)
    return _dot(q, rows / norm, args, consts)


_SCORE_FNS = {"cos": _cos, "dot": _dot}


class Corpus:
    """Rows of an export folder (one array folder or a multi-part manifest) read in row
    ranges, never whole, and its ids read only when asked for; ``num_rows``, ``dim``; rows
    any float dtype, read as float32. Raises FileNotFoundError (a missing part names its
    ``meta.json``), ValueError: files that disagree with ``meta.json``, no such array,
    integer rows."""

    def __init__(self, path: str | os.PathLike, array: str | None = None) -> None:
        self.path = str(path)
        folder = storage.as_path(path)
        if storage.is_remote(folder) and (folder / export_reader.META_FILENAME).is_file():
            # A local copy (cached, fetched again when changed) is read in chunks; np.load
            # of a gs:// .npy would hold every part in memory at once.
            folder = storage.as_path(storage.local_copy(folder))
        if not (folder / export_reader.META_FILENAME).is_file() and \
                (folder / export_reader.MANIFEST_FILENAME).is_file():
            views = sorted(p.name for p in folder.iterdir()
                           if (p / export_reader.META_FILENAME).is_file())
            raise ValueError(f"{path} is an export of views {views}; give one view folder, "
                             f"such as {os.path.join(self.path, views[0] if views else 'VIEW')}")
        parts, meta = export_reader.load_parts(folder, mmap_mode="r", read_ids=False)
        names = sorted(parts[0][0]) if parts else sorted(meta["arrays"])
        if array is None:
            array = export_reader.VIEW_ARRAY if export_reader.VIEW_ARRAY in names or \
                len(names) != 1 else names[0]
        if array not in names:
            raise ValueError(f"{path}: no array {array!r} (arrays {names})")
        self.arrays = [a[array] for a, _ in parts]
        # Counted, not read: 2M ids held as str would take ~150 MB.
        self.id_files = [ids for _, ids in parts]
        self.meta = meta
        shape = meta["arrays"][array]["shape"]
        if len(shape) != 2 or not np.issubdtype(np.dtype(meta["arrays"][array]["dtype"]),
                                                np.floating):
            raise ValueError(f"{path}: array {array!r} is {meta['arrays'][array]['dtype']} "
                             f"{shape}; search reads float rows [num_rows, dim]")
        self.num_rows, self.dim = int(shape[0]), int(shape[1])

    def ids_of(self, rows: np.ndarray) -> dict[int, str]:
        """``{row: id}`` of the distinct ``rows``, reading the ids files once."""
        wanted = set(np.unique(rows).tolist())
        found, start = {}, 0
        for ids in self.id_files:
            if any(start <= r < start + len(ids) for r in wanted):
                for row, text in enumerate(ids.lines(), start):
                    if row in wanted:
                        found[row] = text
            start += len(ids)
        return found

    def all_ids(self) -> list[str]:
        """Every row's id, in row order."""
        return [i for ids in self.id_files for i in ids.lines()]

    def chunks(self, rows: int, first: int = 0, step: int = 1
               ) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, [<= rows, dim] float32)`` of chunks ``first``, ``first + step``, ...
        in row order, across part boundaries; the other chunks are not read."""
        for start in range(first * rows, self.num_rows, step * rows):
            yield start, self.read(start, min(self.num_rows, start + rows))

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows ``a:b`` ``[b - a, dim]`` float32, from the parts they lie in."""
        pieces, offset = [], 0
        for arr in self.arrays:
            lo, hi = max(a, offset), min(b, offset + len(arr))
            if lo < hi:
                pieces.append(_read_rows(arr, lo - offset, hi - offset))
            offset += len(arr)
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def _read_rows(arr: np.ndarray, a: int, b: int) -> np.ndarray:
    """Rows ``a:b`` as float32. A local ``.npy`` is read with ``pread``, not through its
    memory map: touched map pages count in the process's RSS until the kernel needs them,
    so a mapped 3 GB corpus would end up resident; the page cache holds them instead."""
    filename = getattr(arr, "filename", None)
    if isinstance(arr, np.memmap) and filename and arr.flags.c_contiguous:
        row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
        out = np.empty((b - a, *arr.shape[1:]), arr.dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        fd = os.open(filename, os.O_RDONLY)
        try:
            done, offset = 0, arr.offset + a * row_bytes
            while done < len(view):
                n = os.preadv(fd, [view[done:]], offset + done)
                if n <= 0:
                    raise ValueError(f"{filename}: ends before row {b}; the file is truncated")
                done += n
        finally:
            os.close(fd)
        return out.astype(np.float32, copy=False)
    return np.asarray(arr[a:b], np.float32)


def corpus_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(data=1, model=len(devices))`` mesh (default: this process's devices): each
    corpus chunk is split in row blocks over ``model``, the queries replicated."""
    devices = list(jax.local_devices() if devices is None else devices)
    return Mesh(np.asarray(devices).reshape(1, -1), ("data", "model"))


def search(queries: np.ndarray, corpus: Corpus | np.ndarray, k: int, *, score: str = "cos",
           mesh: Mesh | None = None, chunk_rows: int = CHUNK_ROWS, row_block: int = ROW_BLOCK,
           query_batch: int = QUERY_BATCH, across_processes: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [n, k] float32, rows [n, k] int64)``: each query's ``k`` best corpus rows,
    best first; at equal scores the lower row first. ``queries`` ``[n, dim]`` float;
    ``score`` ``cos`` (both sides L2-normalised, eps 1e-12) or ``dot``. Host memory holds
    one ``[chunk_rows, dim]`` chunk and ``[n, 2k]`` running results, whatever the corpus;
    a device ``[query_batch, row_block]`` scores (``row_block`` 0: its whole share).

    Under ``jax.distributed`` every process calls it with the same arguments (a
    collective): chunk ``c`` is ranked on process ``c % process_count`` over its own
    ``mesh``, process 0's queries are searched, and every process returns the result of
    one process. ``across_processes=False``: this process searches everything alone.

    Raises: ValueError: ``k`` not in ``[1, corpus rows]``, dimensions that differ, an
    unknown score, non-finite values (naming the corpus rows), a ``mesh`` of other
    processes' devices, processes that disagree; a peer's error (``multihost.agree``)."""
    mesh = mesh or corpus_mesh()
    count = jax.process_count() if across_processes else 1
    try:
        q, num_rows, chunk, where = _prepare(queries, corpus, k, score, mesh, chunk_rows,
                                             count > 1)
    except ValueError as err:
        if count == 1:
            raise
        multihost.agree(err, "search")  # raises here and, by its type, on the peers
    if count > 1:
        setting = [len(q), q.shape[1], num_rows, int(k), chunk, score]
        statuses = multihost.agree(None, "search", setting=setting)
        if any(s.get("setting") != setting for s in statuses):
            raise ValueError("search: the processes were given different queries, corpus, k "
                             f"or devices ([n, dim, rows, k, chunk, score] "
                             f"{[s.get('setting') for s in statuses]})")
        # One set of queries: an encoding that differs in the last bit between hosts
        # cannot make their results differ.
        q = np.asarray(multihost_utils.broadcast_one_to_all(q), np.float32)
    me = jax.process_index() if count > 1 else 0
    error, best_s, best_i = None, None, None
    try:
        best_s, best_i = _rank_chunks(q, corpus, int(k), score, mesh, chunk, row_block,
                                      query_batch, num_rows, where, me, count)
    except Exception as err:  # told to the peers by agree(), then re-raised
        if count == 1:
            raise
        error = err
    if count == 1:
        return best_s, best_i
    multihost.agree(error, "search")
    return _merge_processes(best_s, best_i, int(k), num_rows)


def _prepare(queries, corpus, k, score: str, mesh: Mesh, chunk_rows: int, several: bool
             ) -> tuple[np.ndarray, int, int, str]:
    """``(queries [n, dim] float32, normalised for cos; corpus rows; chunk rows, a multiple
    of the mesh's model axis; the corpus's name)``. Raises ValueError."""
    if score not in _SCORE_FNS:
        raise ValueError(f"score {score!r}: use one of {SCORES}")
    queries = np.asarray(queries)
    num_rows = corpus.num_rows if isinstance(corpus, Corpus) else len(corpus)
    dim = corpus.dim if isinstance(corpus, Corpus) else np.shape(corpus)[1]
    where = corpus.path if isinstance(corpus, Corpus) else "the corpus"
    if queries.ndim != 2 or len(queries) == 0:
        raise ValueError(f"queries must be [n >= 1, dim], got shape {queries.shape}")
    if queries.shape[1] != dim:
        raise ValueError(f"{where}: rows of dimension {dim}, but the queries have "
                         f"{queries.shape[1]}")
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= num_rows:
        raise ValueError(f"{where}: k={k} must lie in [1, {num_rows}] (the corpus rows)")
    if not np.isfinite(queries).all():
        raise ValueError("the queries hold NaN or infinite values")
    if several and any(d.process_index != jax.process_index() for d in mesh.devices.flat):
        raise ValueError(f"search over several processes ranks on each process's own "
                         f"devices; the mesh {dict(mesh.shape)} holds other processes' "
                         "(use corpus_mesh())")
    q = np.asarray(queries, np.float64)
    if score == "cos":
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), _EPS)
    shards = mesh.shape["model"]
    chunk = -(-max(1, min(int(chunk_rows), num_rows)) // shards) * shards
    return q.astype(np.float32), num_rows, chunk, where


def _rank_chunks(q: np.ndarray, corpus, k: int, score: str, mesh: Mesh, chunk: int,
                 row_block: int, query_batch: int, num_rows: int, where: str, first: int,
                 step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [n, <= k] float32, rows [n, <= k] int64)`` of chunks ``first``,
    ``first + step``, ... (none: ``[n, 0]``)."""
    n = len(q)
    batch = min(int(query_batch), n)
    q = np.pad(q, ((0, -n % batch), (0, 0)))
    sharding = NamedSharding(mesh, PartitionSpec("model", None))
    best_s = np.empty((n, 0), np.float32)
    best_i = np.empty((n, 0), np.int64)
    chunks = corpus.chunks(chunk, first, step) if isinstance(corpus, Corpus) else \
        ((a, np.asarray(corpus[a:a + chunk], np.float32))
         for a in range(first * chunk, num_rows, step * chunk))
    for start, rows in chunks:
        if not np.isfinite(rows).all():
            bad = start + int(np.argwhere(~np.isfinite(rows))[0, 0])
            raise ValueError(f"{where}: row {bad} holds NaN or infinite values")
        real = len(rows)
        if real < chunk:  # the last chunk: padding rows never rank (num_rows=real)
            rows = np.pad(rows, ((0, chunk - real), (0, 0)))
        table = jax.device_put(rows, sharding)
        del rows
        k_here = min(k, real)
        scores, index = [], []
        for a in range(0, len(q), batch):
            s, i = table_ranking.top_k(_SCORE_FNS[score], q[a:a + batch], table, k_here,
                                       num_rows=real, mesh=mesh, row_block=row_block)
            scores.append(np.asarray(s))
            index.append(np.asarray(i))
        del table
        s = np.concatenate(scores)[:n]
        i = np.concatenate(index)[:n].astype(np.int64) + start
        best_s, best_i = _merge(best_s, best_i, s, i, k)
    return best_s, best_i


def _merge_processes(best_s: np.ndarray, best_i: np.ndarray, k: int, num_rows: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Every process's ``[n, <= k]`` results exchanged (a collective) and merged: the same
    ``k`` best on every process, ordered by (score descending, row ascending) as one
    process's chunk merge orders them; padding (-inf, row ``num_rows``) never ranks, as
    the corpus holds >= ``k`` finite scores."""
    pad = k - best_s.shape[1]
    s = np.pad(best_s, ((0, 0), (0, pad)), constant_values=-np.inf)
    i = np.pad(best_i, ((0, 0), (0, pad)), constant_values=num_rows)
    # Rows travel as int32 pairs: process_allgather would cut int64 to JAX's int32.
    s = np.asarray(multihost_utils.process_allgather(s))  # [processes, n, k]
    i = np.asarray(multihost_utils.process_allgather(i.view(np.int32))).view(np.int64)
    s = np.concatenate(list(s), axis=1)
    i = np.concatenate(list(i), axis=1)
    order = np.lexsort((i, -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(i, order, axis=1)


def _merge(best_s: np.ndarray, best_i: np.ndarray, s: np.ndarray, i: np.ndarray, k: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of earlier rows and a later chunk's; a stable sort keeps the earlier
    (lower) row first at equal scores, as ``table_ranking`` does within a chunk."""
    s = np.concatenate([best_s, s], axis=1)
    i = np.concatenate([best_i, i], axis=1)
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(i, order, axis=1)
