"""Streaming, atomic export of embeddings to ``.npy`` files with ids and metadata.

Layout of an export directory::

    <name>.npy    one per array, [num_rows, dim] float32 (NumPy .npy format)
    ids.txt       UTF-8, one id per line: line i (0-based) is the id of row i
    meta.json     the caller's metadata plus shapes, dtype, file names and creation time

Rows arrive in blocks (any order of contiguous blocks, e.g. one per host or per batch)
and go straight into memory-mapped temporary files in the output directory, so no more
than one block is ever held in RAM. On success every file is moved into place with
``os.replace``; on any error the temporary files are deleted and an older export in the
same directory is left as it was. Each file is replaced atomically; ``meta.json`` is
replaced last and :func:`load_arrays` checks that shapes and id count agree with it.

A ``gs://`` output (``embedding_core.storage``) is written the same way, except that the
temporary files live in a local temporary folder and each finished file is uploaded (one
object write is atomic), ``meta.json`` last; readers load ``gs://`` exports into memory.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from etils import epath
from tqdm.auto import tqdm

from embedding_core import multihost, storage
from embedding_core.files import make_readable, write_bytes_atomic, write_json

META_FILENAME = "meta.json"
FORMAT_VERSION = 1
# Keys that the writer puts in meta.json itself; the caller's meta may not use them.
_RESERVED_META_KEYS = ("format_version", "num_rows", "arrays", "ids_file", "created_utc")
# Keys of export_embeddings' result that are not array names.
_RESERVED_ARRAY_NAMES = ("ids", "meta")


def _check_filename(name: str, what: str) -> None:
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        raise ValueError(f"{what} must be a plain file name (no '/', not hidden), got {name!r}")


class EmbeddingWriter:
    """Context manager that streams embedding blocks into an export directory.

    Usage::

        with EmbeddingWriter(out, {"r": 768, "u": 768}, num_rows=n, meta={"model": "..."}) as w:
            for start, ids, r, u in blocks:
                w.write(start, {"r": r, "u": u}, ids)

    Args:
      out_dir: output directory; created if missing (and removed again on failure if this
        writer created it and it is empty).
      arrays: ``{name: dim}``; each name becomes ``<name>.npy`` of shape ``[num_rows, dim]``.
        ``"ids"`` and ``"meta"`` are reserved.
      num_rows: total number of rows, >= 1.
      dtype: floating dtype of the stored arrays (default float32).
      ids_filename: name of the id file (default ``ids.txt``).
      meta: JSON-serialisable dict stored in ``meta.json`` (for example model, checkpoint
        step, data split). Must not use the keys the writer adds.

    Raises:
      ValueError: bad names, dims, row count, dtype, or meta keys; TypeError: meta is not
        JSON-serialisable.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        arrays: Mapping[str, int],
        num_rows: int,
        dtype: npt.DTypeLike = np.float32,
        *,
        ids_filename: str = "ids.txt",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.out_dir = storage.as_path(out_dir)
        self._remote = storage.is_remote(self.out_dir)
        # Memory-mapped temporary files need a local folder: the output itself, or a
        # local staging folder (made on entry) whose files are uploaded when complete.
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

    # ------------------------------------------------------------------ lifecycle

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
                    path, mode="w+", dtype=self.dtype, shape=(self.num_rows, dim)
                )
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

    # ---------------------------------------------------------------------- write

    def write(self, start_row: int, blocks: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        """Write rows ``[start_row, start_row + b)`` of every array and their ids.

        Args:
          start_row: first row of the block, 0-based.
          blocks: ``{name: [b, dim] array}`` for every array named at construction; any
            float dtype (numpy or jax arrays), cast to the writer's dtype.
          ids: ``b`` strings, the ids of these rows; no line breaks.

        Raises:
          RuntimeError: used outside its ``with`` block.
          ValueError: missing/extra arrays, wrong shapes, rows out of range or already
            written, non-finite values (NaN/inf, also after the cast), ids with line breaks.
          TypeError: an id that is not a ``str``.
        """
        if self._state != "open":
            raise RuntimeError("EmbeddingWriter.write must be called inside its `with` block")
        if set(blocks) != set(self.dims):
            raise ValueError(
                f"write needs exactly the arrays {sorted(self.dims)}, got {sorted(blocks)}"
            )
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
                raise ValueError(
                    f"array {name!r}: block shape {arr.shape}, expected ({b}, {self.dims[name]})"
                    f" for {b} ids"
                )
            with np.errstate(over="ignore", invalid="ignore"):
                arr = arr.astype(self.dtype, copy=False)
            finite = np.isfinite(arr)
            if not finite.all():
                row = int(np.argwhere(~finite)[0, 0])
                raise ValueError(
                    f"array {name!r} row {start + row} (id {ids[row]!r}) is not finite "
                    f"(NaN or inf, possibly after casting to {self.dtype}); not exporting it"
                )
            cast[name] = arr
        # Validate everything before touching the files, so a bad block writes nothing.
        self._store(start, cast, ids)
        self._written[start : start + b] = True

    def _store(self, start: int, cast: Mapping[str, np.ndarray], ids: Sequence[str]) -> None:
        for name, arr in cast.items():
            self._memmaps[name][start : start + len(ids)] = arr
        data = "".join(f"{id_}\n" for id_ in ids).encode("utf-8")
        offset = self._ids_spool.tell()
        self._ids_spool.write(data)
        self._id_blocks.append((start, offset, len(data)))

    # --------------------------------------------------------------------- finish

    def _finish(self) -> None:
        if not self._written.all():
            missing = np.flatnonzero(~self._written)
            raise ValueError(
                f"{missing.size} of {self.num_rows} rows were never written "
                f"(first missing rows: {missing[:10].tolist()}); nothing exported to "
                f"{self.out_dir}"
            )
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
            format_version=FORMAT_VERSION,
            num_rows=self.num_rows,
            arrays={
                name: {
                    "file": f"{name}.npy",
                    "shape": [self.num_rows, dim],
                    "dtype": self.dtype.name,
                }
                for name, dim in self.dims.items()
            },
            ids_file=self.ids_filename,
            created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
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
    """The writer's checks without its files: what the processes other than process 0 run
    on the blocks they gathered, so that a bad block stops every process at once."""

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


def iter_row_blocks(array: Any, num_rows: int | None = None, block_rows: int = 8192
                    ) -> Iterator[tuple[int, np.ndarray]]:
    """Rows ``[0, num_rows)`` of a ``[rows, ...]`` array as host blocks, in row order.

    A ``jax.Array`` split by rows over devices (an entity table over ``"model"``) is read
    shard by shard: each block is cut on the device that holds it (one compiled slice
    per shard shape and device) and copied to the host, so the host holds one block and
    no device ever gathers the table. Blocks end every ``block_rows`` rows and at shard
    boundaries; replicated copies are read once. Numpy arrays are sliced.

    Args:
      array: ``[rows, ...]`` numpy or ``jax.Array``.
      num_rows: rows to read (default all; padding rows beyond it are skipped).
      block_rows: rows per block at most, >= 1.

    Yields:
      ``(start, block)``: ``block`` is a numpy ``[b, ...]`` copy of rows
      ``start .. start + b - 1``.

    Raises:
      ValueError: ``block_rows < 1``, ``num_rows`` out of range, or rows held by another
        process's devices only (a table split across hosts).
    """
    import jax

    total = int(array.shape[0])
    num_rows = total if num_rows is None else int(num_rows)
    if isinstance(block_rows, bool) or int(block_rows) != block_rows or block_rows < 1:
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    if not 0 <= num_rows <= total:
        raise ValueError(f"num_rows={num_rows} must lie in [0, {total}]")
    if not isinstance(array, jax.Array):
        for start in range(0, num_rows, block_rows):
            yield start, np.asarray(array[start:min(start + block_rows, num_rows)])
        return
    pieces: dict[int, tuple[int, Any]] = {}
    for shard in array.addressable_shards:
        rows = shard.index[0] if shard.index else slice(None)
        start = rows.start or 0
        stop = total if rows.stop is None else rows.stop
        pieces.setdefault(start, (stop, shard.data))
    position = 0
    while position < num_rows:
        if position not in pieces:
            raise ValueError(f"rows from {position} of a [{total}, ...] array lie on another "
                             "process's devices; read the array where it is whole (e.g. a "
                             "model axis within one host)")
        stop, data = pieces[position]
        stop = min(stop, num_rows)
        rows_here = int(data.shape[0])
        size = min(int(block_rows), rows_here)
        for begin in range(0, stop - position, size):
            n = min(size, stop - position - begin)
            if size == rows_here:
                block = np.asarray(data)[begin:begin + n]
            else:  # the slice is taken on the shard's device; only it is copied
                first = min(begin, rows_here - size)
                block = np.asarray(_device_rows(size)(data, first))[begin - first:
                                                                   begin - first + n]
            yield position + begin, block
        position = stop


@functools.lru_cache(maxsize=8)
def _device_rows(size: int):
    import jax

    return jax.jit(lambda x, start: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0))


def export_embeddings(
    out_dir: str | os.PathLike,
    batches: Iterable[tuple[Sequence[str], Mapping[str, np.ndarray]]],
    num_rows: int,
    dims: Mapping[str, int],
    meta: Mapping[str, Any] | None = None,
    ids_filename: str = "ids.txt",
) -> dict[str, epath.Path]:
    """Write ``batches`` in order as one export, with a tqdm progress bar (in rows).

    Args:
      out_dir: output directory.
      batches: iterable of ``(ids, {name: [b, dim] array})``, rows in order.
      num_rows: total rows the batches add up to.
      dims: ``{name: dim}`` of the arrays.
      meta: JSON-serialisable metadata for ``meta.json``.
      ids_filename: name of the id file.

    Returns:
      ``{array name: Path of <name>.npy, "ids": Path, "meta": Path}``.

    Several processes (``docs/architecture.md``): every process iterates ``batches`` (their
    blocks may be gathered across processes, ``embedding_core.multihost.split_map``) and
    checks them; process 0 alone writes the files.

    Raises:
      ValueError: as :class:`EmbeddingWriter` (too many or too few rows, NaN, ...); in that
        case nothing new is left in ``out_dir``.
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


def load_arrays(
    out_dir: str | os.PathLike, mmap_mode: str | None = None
) -> tuple[dict[str, np.ndarray], list[str], dict[str, Any]]:
    """Read an export written by :class:`EmbeddingWriter`.

    Args:
      out_dir: export directory (local or ``gs://``).
      mmap_mode: passed to ``np.load`` (e.g. ``"r"`` to map large arrays, not read them);
        ignored for ``gs://``, whose arrays are read into memory.

    Returns:
      ``(arrays, ids, meta)``: ``{name: [num_rows, dim] array}``, the ``num_rows`` ids
      (``ids[i]`` belongs to row ``i``), and the parsed ``meta.json``.

    Raises:
      FileNotFoundError: ``meta.json`` or a listed file is missing.
      ValueError: a file disagrees with ``meta.json`` (shape, dtype, number of ids).
    """
    out_dir = storage.as_path(out_dir)
    meta_path = out_dir / META_FILENAME
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no {META_FILENAME}; not an export directory")
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_path}: not valid JSON ({err})") from None
    try:
        num_rows = int(meta["num_rows"])
        spec = meta["arrays"]
        ids_file = meta["ids_file"]
    except KeyError as e:
        raise ValueError(f"{meta_path}: missing field {e}") from e
    arrays = {}
    for name, info in spec.items():
        path = out_dir / info["file"]
        arr = _load_npy(path, mmap_mode)
        if list(arr.shape) != list(info["shape"]) or arr.dtype.name != info["dtype"]:
            raise ValueError(
                f"{path}: shape {list(arr.shape)} dtype {arr.dtype.name} disagrees with "
                f"{meta_path} field 'arrays.{name}' ({info['shape']}, {info['dtype']})"
            )
        arrays[name] = arr
    ids_path = out_dir / ids_file
    try:
        text = ids_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{ids_path}: not UTF-8 ({err.reason})") from None
    if text and not text.endswith("\n"):
        raise ValueError(f"{ids_path}: last line has no newline; the file is truncated")
    ids = text.split("\n")[:-1]
    if len(ids) != num_rows:
        raise ValueError(
            f"{ids_path}: {len(ids)} ids, but {meta_path} field 'num_rows' is {num_rows}"
        )
    return arrays, ids, meta


def _load_npy(path: epath.Path, mmap_mode: str | None) -> np.ndarray:
    if storage.is_remote(path):
        return np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
    return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


# ----------------------------------------------------------------------------- views

VIEW_ARRAY = "embeddings"
# What every view's meta.json must say, so a reader can use the vectors without our code.
VIEW_META_KEYS = ("model", "config", "step", "normalized", "similarity")
SIMILARITIES = ("cosine", "dot", "euclidean")


def export_view(
    out_dir: str | os.PathLike,
    blocks: Iterable[tuple[Sequence[str], np.ndarray]],
    *,
    num_rows: int,
    dim: int,
    meta: Mapping[str, Any],
) -> dict[str, epath.Path]:
    """Writes one view of an export: ``embeddings.npy``, ``ids.txt``, ``meta.json``.

    The project's one export layout (``docs/architecture.md``): an export folder holds one
    sub-folder per view (DualCSE ``explicit/`` and ``implicit/``, DocEnt ``entities/`` and
    ``queries/``, MRWE ``questions/`` and ``paragraphs/``); each is written by this function,
    streamed block by block and moved into place only when complete.

    Args:
      out_dir: the view's folder (e.g. ``export/explicit``).
      blocks: ``(ids, vectors [b, dim])`` in row order.
      num_rows: total rows; dim: vector width.
      meta: must hold ``model``, ``config``, ``step``, ``normalized`` (bool: rows have unit
        L2 norm) and ``similarity`` (``cosine``, ``dot`` or ``euclidean``: how the
        vectors are meant to be compared); anything else JSON-serialisable may be added.

    Returns:
      ``{"embeddings": .npy path, "ids": ..., "meta": ...}``.

    Raises:
      ValueError: missing meta keys, an unknown similarity, or as :class:`EmbeddingWriter`
        (row count, NaN, ...); nothing new is left in ``out_dir`` then.
    """
    missing = [k for k in VIEW_META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"export meta lacks {missing}")
    if meta["similarity"] not in SIMILARITIES:
        raise ValueError(f"meta similarity={meta['similarity']!r}: use one of {SIMILARITIES}")
    return export_embeddings(out_dir, ((ids, {VIEW_ARRAY: v}) for ids, v in blocks),
                             num_rows=num_rows, dims={VIEW_ARRAY: dim}, meta=dict(meta))


def load_view(out_dir: str | os.PathLike, mmap_mode: str | None = None
              ) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """``(embeddings [N, dim] float32, ids, meta)`` of one view folder."""
    arrays, ids, meta = load_arrays(out_dir, mmap_mode)
    if VIEW_ARRAY not in arrays:
        raise ValueError(f"{out_dir}: not a view folder (arrays {sorted(arrays)}, expected "
                         f"{VIEW_ARRAY!r})")
    return arrays[VIEW_ARRAY], ids, meta


MANIFEST_FILENAME = "export.json"


class ExportFolder:
    """An export of several views that is consistent as a whole.

    Each view is written atomically by :func:`export_view` with this export's id in its
    ``meta.json``; ``export.json`` (the id and the list of views) is written last, only when
    every view succeeded. :func:`load_export` reads the views the manifest lists and refuses
    a view whose id differs (an export interrupted half-way), and ignores views of older
    exports into the same folder. With several processes every process runs the same
    ``with`` block (each computing its slice of the rows), process 0 alone writes, and all
    leave it together: when the export completed, or each raising when one process failed.

    Usage::

        with ExportFolder(output) as folder:
            folder.view("explicit", blocks, num_rows=n, dim=d, meta=meta)

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
        # Until the export completes, the manifest says so: a reader of a folder whose
        # export was killed half-way (even a first export) gets a clear refusal.
        error = None
        if multihost.is_primary():  # several processes: process 0 writes, the rest check
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
            "format_version": FORMAT_VERSION,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")})

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit: no exchange with the peers
        error = exc
        if multihost.is_primary():
            try:
                self._close(complete=exc is None)
            except Exception as err:
                error = error or err
        # Every process returns once the files are complete, or raises with the others.
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


def load_export(out_dir: str | os.PathLike, mmap_mode: str | None = None
                ) -> dict[str, tuple[np.ndarray, list[str], dict[str, Any]]]:
    """Every view of an export folder (or the one view, when given a view folder).

    With an ``export.json`` (written by :class:`ExportFolder`), exactly the views it lists
    are read, and each must carry its export id. Without one, every sub-folder holding a
    ``meta.json`` is a view.

    Returns:
      ``{view name: (embeddings, ids, meta)}``; a view folder itself maps its own name.

    Raises:
      FileNotFoundError: ``out_dir`` holds neither ``meta.json`` nor view folders, or a
        listed view is missing.
      ValueError: a view from another export (the last export was interrupted: re-run it),
        or files that disagree with their ``meta.json``.
    """
    out_dir = storage.as_path(out_dir)
    if (out_dir / META_FILENAME).is_file():
        return {out_dir.name: load_view(out_dir, mmap_mode)}
    manifest_path = out_dir / MANIFEST_FILENAME
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            export_id, names = manifest["export_id"], list(manifest["views"])
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{manifest_path}: not an export manifest ({err})") from None
        if not manifest.get("complete", True):
            raise ValueError(f"{out_dir}: the export into this folder did not finish (it was "
                             "interrupted or failed); run the export again")
        views = {}
        for name in names:
            views[name] = load_view(out_dir / name, mmap_mode)
            if views[name][2].get("export_id") != export_id:
                raise ValueError(
                    f"{out_dir / name} belongs to another export than {manifest_path} (an "
                    "export into this folder was interrupted); run the export again")
        return views
    views = sorted(p for p in out_dir.iterdir() if (p / META_FILENAME).is_file()) \
        if out_dir.is_dir() else []
    if not views:
        what = "does not exist" if not out_dir.exists() else \
            "holds no export (no meta.json and no view folders holding one)"
        raise FileNotFoundError(f"{out_dir} {what}")
    return {p.name: load_view(p, mmap_mode) for p in views}
