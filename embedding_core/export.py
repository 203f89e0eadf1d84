"""Streaming, atomic export of embeddings: ``<name>.npy`` ``[num_rows, dim]``, ``ids.txt``
(line i = id of row i), ``meta.json``; views and ``export.json`` (``docs/architecture.md``,
"One export layout"). The readers (``export_reader``) are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from etils import epath
from tqdm.auto import tqdm

from embedding_core import multihost, storage
from embedding_core.export_reader import (  # noqa: F401
    MANIFEST_FILENAME,
    META_FILENAME,
    VIEW_ARRAY,
    load_arrays,
    load_export,
    load_view,
)
from embedding_core.files import make_readable, write_bytes_atomic, write_json

FORMAT_VERSION = 1
# What every view's meta.json must say, so a reader can use the vectors without our code.
VIEW_META_KEYS = ("model", "config", "step", "normalized", "similarity")
SIMILARITIES = ("cosine", "dot", "euclidean")
_RESERVED_META_KEYS = ("format_version", "num_rows", "arrays", "ids_file", "created_utc")
_RESERVED_ARRAY_NAMES = ("ids", "meta")  # keys of export_embeddings' result


def _check_filename(name: str, what: str) -> None:
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name
            or "\\" in name or "\0" in name):
        raise ValueError(f"{what} must be a plain file name (no '/', not hidden), got {name!r}")


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class EmbeddingWriter:
    """Context manager that streams embedding blocks into an export folder.

    Args:
      out_dir: output folder; created if missing (removed again on failure if empty).
      arrays: ``{name: dim}``: ``<name>.npy`` ``[num_rows, dim]`` (not ``"ids"``, ``"meta"``).
      num_rows: >= 1. meta: JSON-serialisable, without the writer's keys.

    Raises:
      ValueError: bad names, dims, row count, dtype, or meta keys; TypeError: meta is not
        JSON-serialisable.
    """

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
        if not np.issubdtype(self.dtype, np.floating):
            raise ValueError(f"dtype must be a floating type, got {self.dtype}")
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
        self._memmaps: dict[str, np.memmap] = {}
        self._array_tmp: dict[str, Path] = {}
        self._ids_spool = None
        self._ids_spool_path: Path | None = None
        # (start_row, byte offset, byte length) of each block's ids in the spool file.
        self._id_blocks: list[tuple[int, int, int]] = []
        self._written: np.ndarray | None = None

    @property
    def output_paths(self) -> dict[str, epath.Path]:
        """Final paths: ``{array name: <name>.npy, "ids": ids file, "meta": meta.json}``."""
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
                self._memmaps[name] = np.lib.format.open_memmap(
                    path, mode="w+", dtype=self.dtype, shape=(self.num_rows, dim))
            self._ids_spool_path = self._tmp_file(f"{self.ids_filename}.spool")
            self._ids_spool = open(self._ids_spool_path, "wb")
            self._written = np.zeros(self.num_rows, dtype=bool)
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
        """Writes rows ``[start_row, start_row + b)``: ``blocks`` ``{name: [b, dim]}`` of
        every array (any float dtype, cast) and ``b`` ids without line breaks.

        Raises:
          RuntimeError: outside the ``with`` block.
          ValueError: missing/extra arrays, wrong shapes, rows out of range or already
            written, NaN/inf (also after the cast), ids with line breaks.
          TypeError: an id that is not a ``str``.
        """
        if self._state != "open":
            raise RuntimeError("EmbeddingWriter.write must be called inside its `with` block")
        if set(blocks) != set(self.dims):
            raise ValueError(f"write needs exactly the arrays {sorted(self.dims)}, got "
                             f"{sorted(blocks)}")
        b = len(ids)
        start = int(start_row)
        if start < 0 or start + b > self.num_rows:
            raise ValueError(f"rows [{start}, {start + b}) fall outside [0, {self.num_rows})")
        for i, id_ in enumerate(ids):
            if not isinstance(id_, str):
                raise TypeError(f"id of row {start + i} must be str, got {type(id_).__name__}")
            if "\n" in id_ or "\r" in id_:
                raise ValueError(f"id of row {start + i} contains a line break: {id_!r}")
        if self._written[start : start + b].any():
            first = start + int(np.argmax(self._written[start : start + b]))
            raise ValueError(f"row {first} was already written")
        cast = {}
        for name, block in blocks.items():
            arr = np.asarray(block)
            if arr.shape != (b, self.dims[name]):
                raise ValueError(f"array {name!r}: block shape {arr.shape}, expected "
                                 f"({b}, {self.dims[name]}) for {b} ids")
            with np.errstate(over="ignore", invalid="ignore"):
                arr = arr.astype(self.dtype, copy=False)
            finite = np.isfinite(arr)
            if not finite.all():
                row = int(np.argwhere(~finite)[0, 0])
                raise ValueError(
                    f"array {name!r} row {start + row} (id {ids[row]!r}) is not finite "
                    f"(NaN or inf, possibly after casting to {self.dtype}); not exporting it")
            cast[name] = arr
        # Everything is checked before the files are touched: a bad block writes nothing.
        self._store(start, cast, ids)
        self._written[start : start + b] = True

    def _store(self, start: int, cast: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        for name, arr in cast.items():
            self._memmaps[name][start : start + len(ids)] = arr
        data = "".join(f"{id_}\n" for id_ in ids).encode("utf-8")
        offset = self._ids_spool.tell()
        self._ids_spool.write(data)
        self._id_blocks.append((start, offset, len(data)))

    def _finish(self) -> None:
        if not self._written.all():
            missing = np.flatnonzero(~self._written)
            raise ValueError(
                f"{missing.size} of {self.num_rows} rows were never written "
                f"(first missing rows: {missing[:10].tolist()}); nothing exported to "
                f"{self.out_dir}")
        for mm in self._memmaps.values():
            mm.flush()
        self._memmaps.clear()  # closes the maps before the files move
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
        for path in self._array_tmp.values():
            with open(path, "rb+") as f:
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

    def _cleanup(self) -> None:
        if self._state != "done":
            self._state = "failed"
        self._memmaps.clear()
        if self._ids_spool is not None and not self._ids_spool.closed:
            self._ids_spool.close()
        for path in self._tmp_paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        self._tmp_paths.clear()
        if self._remote and self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
        if self._state == "failed" and self._created_dir:
            try:
                self.out_dir.rmdir()  # only if empty
            except OSError:
                pass


class _CheckingWriter(EmbeddingWriter):
    """The writer's checks without its files: processes other than 0 check their blocks
    so that a bad block stops every process at once."""

    def __enter__(self) -> EmbeddingWriter:
        if self._state != "new":
            raise RuntimeError("an EmbeddingWriter can be entered only once")
        self._state = "open"
        self._written = np.zeros(self.num_rows, dtype=bool)
        return self

    def _store(self, start: int, cast: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        pass

    def _finish(self) -> None:
        if not self._written.all():
            raise ValueError(f"{int((~self._written).sum())} of {self.num_rows} rows were "
                             f"never written; nothing exported to {self.out_dir}")
        self._state = "done"

    def _cleanup(self) -> None:
        if self._state != "done":
            self._state = "failed"


def export_embeddings(out_dir: str | os.PathLike,
                      batches: Iterable[tuple[Sequence[str], Mapping[str, np.ndarray]]],
                      num_rows: int, dims: Mapping[str, int],
                      meta: Mapping[str, Any] | None = None,
                      ids_filename: str = "ids.txt") -> dict[str, epath.Path]:
    """Writes ``batches`` (``(ids, {name: [b, dim]})``, rows in order) as one export, with
    a progress bar; every process checks the blocks, process 0 alone writes.

    Returns ``{array name: <name>.npy path, "ids": path, "meta": path}``.

    Raises:
      ValueError: as :class:`EmbeddingWriter`; nothing new is left in ``out_dir``.
    """
    primary = multihost.is_primary()
    writer = (EmbeddingWriter if primary else _CheckingWriter)(
        out_dir, dims, num_rows, ids_filename=ids_filename, meta=meta)
    with writer, tqdm(total=num_rows, unit="row", desc=f"export {out_dir}",
                      disable=not primary or None) as bar:
        start = 0
        for ids, blocks in batches:
            writer.write(start, blocks, ids)
            start += len(ids)
            bar.update(len(ids))
    return writer.output_paths


def export_view(out_dir: str | os.PathLike, blocks: Iterable[tuple[Sequence[str], np.ndarray]],
                *, num_rows: int, dim: int, meta: Mapping[str, Any]) -> dict[str, epath.Path]:
    """Writes one view folder: ``embeddings.npy`` ``[num_rows, dim]``, ``ids.txt``,
    ``meta.json``, from ``(ids, vectors [b, dim])`` blocks in row order.

    ``meta`` must hold :data:`VIEW_META_KEYS` (``normalized``: bool; ``similarity``: one
    of :data:`SIMILARITIES`) and may add anything JSON-serialisable.

    Returns ``{"embeddings": .npy path, "ids": ..., "meta": ...}``.

    Raises:
      ValueError: missing meta keys, an unknown similarity, or as :class:`EmbeddingWriter`.
    """
    missing = [k for k in VIEW_META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"export meta lacks {missing}")
    if meta["similarity"] not in SIMILARITIES:
        raise ValueError(f"meta similarity={meta['similarity']!r}: use one of {SIMILARITIES}")
    return export_embeddings(out_dir, ((ids, {VIEW_ARRAY: v}) for ids, v in blocks),
                             num_rows=num_rows, dims={VIEW_ARRAY: dim}, meta=dict(meta))


class ExportFolder:
    """An export of several views, consistent as a whole (``docs/architecture.md``).

    Each view's ``meta.json`` carries this export's id; ``export.json`` says incomplete on
    entry and complete on a clean exit (a failure with no view written restores the old
    one). Every process runs the block, process 0 writes, all leave or raise together.

    Raises:
      FileExistsError: ``output`` exists and is not a folder.
    """

    def __init__(self, output: str | os.PathLike) -> None:
        self.output = storage.as_path(output)
        if self.output.exists() and not self.output.is_dir():
            raise FileExistsError(f"--output {self.output} exists and is not a folder")
        self.export_id = uuid.uuid4().hex
        self.views: list[str] = []

    def tag(self, name: str) -> dict[str, str]:
        """Registers view ``name``; returns the meta entries that tie it to this export."""
        _check_filename(name, "view name")
        if name == MANIFEST_FILENAME or name in self.views:
            raise ValueError(f"view name {name!r} is reserved or used twice")
        self.views.append(name)
        return {"export_id": self.export_id}

    def view(self, name: str, blocks: Iterable[tuple[Sequence[str], np.ndarray]], *,
             num_rows: int, dim: int, meta: Mapping[str, Any]) -> dict[str, epath.Path]:
        """Writes view ``name`` (see :func:`export_view`)."""
        return export_view(self.output / name, blocks, num_rows=num_rows, dim=dim,
                           meta={**meta, **self.tag(name)})

    def __enter__(self) -> ExportFolder:
        error = None
        if multihost.is_primary():
            try:
                manifest = self.output / MANIFEST_FILENAME
                self._previous = manifest.read_bytes() if manifest.is_file() else None
                self._manifest(complete=False)
            except Exception as err:
                error = err
        multihost.agree(error, f"export to {self.output}")
        return self

    def _manifest(self, complete: bool) -> None:
        write_json(self.output / MANIFEST_FILENAME, {
            "export_id": self.export_id, "views": self.views, "complete": complete,
            "format_version": FORMAT_VERSION, "created_utc": _utc_now()})

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit: no exchange with the peers
        error = exc
        if multihost.is_primary():
            try:
                self._close(complete=exc is None)
            except Exception as err:
                error = error or err
        try:
            multihost.agree(error, f"export to {self.output}")
        except Exception as err:
            if err is not exc:
                raise
        return False

    def _close(self, complete: bool) -> None:
        if complete:
            self._manifest(complete=True)
            return
        written = [v for v in self.views if _view_id(self.output / v) == self.export_id]
        if not written:  # nothing of this export reached the folder: it is as it was
            manifest = self.output / MANIFEST_FILENAME
            if self._previous is None:
                manifest.unlink(missing_ok=True)
            else:
                write_bytes_atomic(manifest, self._previous)


def _view_id(folder: epath.Path) -> str | None:
    try:
        return json.loads((folder / META_FILENAME).read_text(encoding="utf-8")).get("export_id")
    except (OSError, ValueError, AttributeError):
        return None
