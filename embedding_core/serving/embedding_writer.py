"""The streaming, atomic writer of one export folder: ``<name>.npy`` ``[num_rows, dim]``,
``ids.txt``, ``meta.json`` (``docs/architecture.md``, "One export layout")."""

from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from etils import epath

from embedding_core.serving.export_reader import META_FILENAME
from embedding_core.storage import storage
from embedding_core.storage.files import make_readable

FORMAT_VERSION = 1
# What every view's meta.json must say, so a reader can use the vectors without our code.
VIEW_META_KEYS = ("model", "config", "step", "normalized", "similarity")
SIMILARITIES = ("cosine", "dot", "euclidean")
_RESERVED_META_KEYS = ("format_version", "num_rows", "arrays", "ids_file", "created_utc")
_RESERVED_ARRAY_NAMES = ("ids", "meta")  # keys of export_embeddings' result
CODE_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def _check_filename(name: str, what: str) -> None:
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name
            or "\\" in name or "\0" in name):
        raise ValueError(f"{what} must be a plain file name (no '/', not hidden), got {name!r}")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _Runs:
    """Rows as sorted, disjoint ``[start, stop)`` runs (rows written in order: one)."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def first_in(self, start: int, stop: int) -> int | None:
        i = bisect.bisect_right(self.runs, [start, float("inf")]) - 1
        for run in self.runs[max(i, 0):]:
            if run[0] >= stop:
                break
            if run[1] > start:
                return max(run[0], start)
        return None

    def add(self, start: int, stop: int) -> None:
        i = bisect.bisect_left(self.runs, [start, stop])
        self.runs.insert(i, [start, stop])
        if i + 1 < len(self.runs) and self.runs[i + 1][0] == stop:  # joins the next run
            self.runs[i][1] = self.runs.pop(i + 1)[1]
        if i and self.runs[i - 1][1] == start:  # joins the previous run
            self.runs[i - 1][1] = self.runs.pop(i)[1]

    def missing(self, total: int, limit: int = 10) -> tuple[int, list[int]]:
        count, first, position = 0, [], 0
        for start, stop in [*self.runs, [total, total]]:
            count += start - position
            first += list(range(position, min(start, position + limit - len(first))))
            position = stop
        return count, first


class EmbeddingWriter:
    """Streams blocks of ``arrays`` (``{name: dim}``) into ``out_dir`` (created; removed on
    failure if empty). Raises ValueError: bad names, dims, row count, dtype or meta keys;
    TypeError: meta is not JSON-serialisable."""

    def __init__(self, out_dir: str | os.PathLike, arrays: Mapping[str, int], num_rows: int,
                 dtype: npt.DTypeLike = np.float32, *, ids_filename: str = "ids.txt",
                 meta: Mapping[str, Any] | None = None) -> None:
        self.out_dir = storage.as_path(out_dir)
        self._remote = storage.is_remote(self.out_dir)
        # Memory maps need a local folder: the output itself, or a staging folder.
        self._tmp_dir: Path | None = None if self._remote else Path(self.out_dir)
        if not arrays:
            raise ValueError("arrays must name at least one array")
        for name, dim in arrays.items():
            _check_filename(name, "array name")
            if name in _RESERVED_ARRAY_NAMES:
                raise ValueError(f"array name {name!r} is reserved ({_RESERVED_ARRAY_NAMES})")
            if isinstance(dim, bool) or int(dim) != dim or dim < 1:
                raise ValueError(f"dim of array {name!r} must be a positive int, got {dim!r}")
        self.dims = {name: int(dim) for name, dim in arrays.items()}
        if isinstance(num_rows, bool) or int(num_rows) != num_rows or num_rows < 1:
            raise ValueError(f"num_rows must be a positive int, got {num_rows!r}")
        self.num_rows = int(num_rows)
        self.dtype = np.dtype(dtype)
        # int8/uint8: quantized exports (embedding_core/serving/quantize.py).
        if not np.issubdtype(self.dtype, np.floating) and self.dtype not in CODE_DTYPES:
            raise ValueError(f"dtype must be a floating type, int8 or uint8, got {self.dtype}")
        _check_filename(ids_filename, "ids_filename")
        if ids_filename == META_FILENAME or ids_filename in {f"{n}.npy" for n in self.dims}:
            raise ValueError(f"ids_filename {ids_filename!r} collides with another output")
        self.ids_filename = ids_filename
        self.meta = dict(meta or {})
        clash = sorted(set(self.meta) & set(_RESERVED_META_KEYS))
        if clash:
            raise ValueError(f"meta keys {clash} are reserved for the writer")
        try:
            json.dumps(self.meta)
        except TypeError as e:
            raise TypeError(f"meta must be JSON-serialisable: {e}") from e
        self._state = "new"
        self._created_dir = False
        self._tmp_paths: list[Path] = []
        # Open .npy files and their header sizes: rows go in with pwrite, not through a
        # memory map, whose written pages would count in this process's RSS.
        self._files: dict[str, tuple[int, int]] = {}
        self._array_tmp: dict[str, Path] = {}
        self._ids_spool = None
        self._ids_spool_path: Path | None = None
        # (start_row, byte offset, byte length) of each block's ids in the spool file.
        self._id_blocks: list[tuple[int, int, int]] = []
        self._written = _Runs()
        self.first_row = 0  # of a part of a larger export: error messages count from it

    @property
    def output_paths(self) -> dict[str, epath.Path]:
        """``{array name: <name>.npy, "ids": ids file, "meta": meta.json}``."""
        paths = {name: self.out_dir / f"{name}.npy" for name in self.dims}
        paths["ids"] = self.out_dir / self.ids_filename
        paths["meta"] = self.out_dir / META_FILENAME
        return paths

    def _tmp_file(self, stem: str) -> Path:
        fd, path = tempfile.mkstemp(dir=self._tmp_dir, prefix=f".{stem}.", suffix=".tmp")
        os.close(fd)
        make_readable(path)  # others may read an export (mkstemp makes it 0600)
        self._tmp_paths.append(Path(path))
        return Path(path)

    def __enter__(self) -> EmbeddingWriter:
        if self._state != "new":
            raise RuntimeError("an EmbeddingWriter can be entered only once")
        self._state = "open"
        try:
            if self._remote:
                self._tmp_dir = Path(tempfile.mkdtemp(prefix="embedding_jax_export."))
            elif not self.out_dir.exists():
                self.out_dir.mkdir(parents=True)
                self._created_dir = True
            for name, dim in self.dims.items():
                path = self._tmp_file(f"{name}.npy")
                self._array_tmp[name] = path
                header = np.lib.format.open_memmap(
                    path, mode="w+", dtype=self.dtype, shape=(self.num_rows, dim))
                offset = header.offset
                del header
                self._files[name] = (os.open(path, os.O_WRONLY), offset)
            self._ids_spool_path = self._tmp_file(f"{self.ids_filename}.spool")
            self._ids_spool = open(self._ids_spool_path, "wb")
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self._cleanup()
            return False
        try:
            self._finish()
        except BaseException:
            self._cleanup()
            raise
        return False

    def write(self, start_row: int, blocks: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        """Rows ``[start_row, start_row + b)`` of every array (``{name: [b, dim]}``) and ids.

        Raises: RuntimeError: outside the ``with``. ValueError: missing arrays, wrong
        shapes, rows out of range or written, NaN/inf, ids with line breaks. TypeError."""
        if self._state != "open":
            raise RuntimeError("EmbeddingWriter.write must be called inside its `with` block")
        if set(blocks) != set(self.dims):
            raise ValueError(f"write needs exactly the arrays {sorted(self.dims)}, got "
                             f"{sorted(blocks)}")
        b = len(ids)
        start = int(start_row)
        if start < 0 or start + b > self.num_rows:
            raise ValueError(f"rows [{start}, {start + b}) fall outside [0, {self.num_rows})")
        shown = start + self.first_row
        for i, id_ in enumerate(ids):
            if not isinstance(id_, str):
                raise TypeError(f"id of row {shown + i} must be str, got {type(id_).__name__}")
            if "\n" in id_ or "\r" in id_:
                raise ValueError(f"id of row {shown + i} contains a line break: {id_!r}")
        first = self._written.first_in(start, start + b)
        if first is not None:
            raise ValueError(f"row {first} was already written")
        cast = {}
        for name, block in blocks.items():
            arr = np.asarray(block)
            if arr.shape != (b, self.dims[name]):
                raise ValueError(f"array {name!r}: block shape {arr.shape}, expected "
                                 f"({b}, {self.dims[name]}) for {b} ids")
            if self.dtype in CODE_DTYPES and arr.dtype != self.dtype:
                # A cast would wrap or truncate codes silently: they come quantized.
                raise ValueError(f"array {name!r}: block dtype {arr.dtype}, expected "
                                 f"{self.dtype} codes")
            with np.errstate(over="ignore", invalid="ignore"):
                arr = arr.astype(self.dtype, copy=False)
            finite = np.isfinite(arr)
            if not finite.all():
                row = int(np.argwhere(~finite)[0, 0])
                raise ValueError(
                    f"array {name!r} row {shown + row} (id {ids[row]!r}) is not finite "
                    f"(NaN or inf, possibly after casting to {self.dtype}); not exporting it")
            cast[name] = arr
        # Everything is checked before the files are touched: a bad block writes nothing.
        self._store(start, cast, ids)
        self._written.add(start, start + b)

    def _store(self, start: int, cast: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        for name, arr in cast.items():
            fd, offset = self._files[name]
            data = memoryview(np.ascontiguousarray(arr)).cast("B")
            at = offset + start * self.dims[name] * self.dtype.itemsize
            while data:  # pwrite may write less than asked
                done = os.pwrite(fd, data, at)
                data, at = data[done:], at + done
        data = "".join(f"{id_}\n" for id_ in ids).encode("utf-8")
        offset = self._ids_spool.tell()
        self._ids_spool.write(data)
        self._id_blocks.append((start, offset, len(data)))

    def _finish(self) -> None:
        count, first = self._written.missing(self.num_rows)
        if count:
            raise ValueError(
                f"{count} of {self.num_rows} rows were never written "
                f"(first missing rows: {first}); nothing exported to {self.out_dir}")
        self._close_files()
        self._ids_spool.close()
        ids_tmp = self._tmp_file(self.ids_filename)
        with open(self._ids_spool_path, "rb") as spool, open(ids_tmp, "wb") as out:
            for _, offset, length in sorted(self._id_blocks):
                spool.seek(offset)
                out.write(spool.read(length))
            out.flush()
            os.fsync(out.fileno())
        meta = dict(self.meta)
        meta.update(
            format_version=FORMAT_VERSION, num_rows=self.num_rows,
            arrays={name: {"file": f"{name}.npy", "shape": [self.num_rows, dim],
                           "dtype": self.dtype.name} for name, dim in self.dims.items()},
            ids_file=self.ids_filename, created_utc=_utc_now())
        meta_tmp = self._tmp_file(META_FILENAME)
        with open(meta_tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        finals = self.output_paths
        # meta.json last: its presence with matching shapes marks a complete export.
        moves = [(self._array_tmp[n], finals[n]) for n in self.dims]
        moves += [(ids_tmp, finals["ids"]), (meta_tmp, finals["meta"])]
        for src, dst in moves:
            if self._remote:
                storage.upload(src, dst)
            else:
                os.replace(src, dst)
            self._tmp_paths.remove(src)
        self._state = "done"
        self._cleanup()  # removes the spool

    def _close_files(self, sync: bool = True) -> None:
        while self._files:
            _, (fd, _) = self._files.popitem()
            try:
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _cleanup(self) -> None:
        if self._state != "done":
            self._state = "failed"
        self._close_files(sync=False)
        if self._ids_spool is not None and not self._ids_spool.closed:
            self._ids_spool.close()
        for path in self._tmp_paths:
            path.unlink(missing_ok=True)
        self._tmp_paths.clear()
        if self._remote and self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
        if self._state == "failed" and self._created_dir:
            try:
                self.out_dir.rmdir()  # only if empty
            except OSError:
                pass


class _CheckingWriter(EmbeddingWriter):
    """The checks without the files: a bad block on any process stops them all."""

    def __enter__(self) -> EmbeddingWriter:
        if self._state != "new":
            raise RuntimeError("an EmbeddingWriter can be entered only once")
        self._state = "open"
        return self

    def _store(self, start: int, cast: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        pass

    def _finish(self) -> None:
        count = self._written.missing(self.num_rows)[0]
        if count:
            raise ValueError(f"{count} of {self.num_rows} rows were never written; nothing "
                             f"exported to {self.out_dir}")
        self._state = "done"

    def _cleanup(self) -> None:
        if self._state != "done":
            self._state = "failed"
