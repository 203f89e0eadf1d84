"""One export folder written by several processes, each its rows as a part folder, then
process 0 the ``meta.json`` listing them (``docs/architecture.md``, "One export layout")."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import numpy.typing as npt
from etils import epath

from embedding_core.distributed import multihost
from embedding_core.serving.embedding_writer import FORMAT_VERSION, EmbeddingWriter, _utc_now
from embedding_core.serving.export_reader import META_FILENAME
from embedding_core.storage import storage
from embedding_core.storage.files import write_json

PARTS_FORMAT_VERSION = 2
# (ids, {name: [b, dim]}) blocks: every row in order (each process keeps its slice), or a
# function (start, stop) -> the blocks of rows [start, stop) alone.
Blocks = Iterable[tuple[Sequence[str], Mapping[str, np.ndarray]]]
Batches = Blocks | Callable[[int, int], Blocks]


def part_name(index: int, count: int) -> str:
    """A part folder's name (a random tail: an older export's parts stay until replaced)."""
    return f"part-{index:05d}-of-{count:05d}.{uuid.uuid4().hex[:8]}"


def listed_files(out_dir: epath.Path) -> list[epath.Path]:
    """The part folders or files ``out_dir``'s readable ``meta.json`` lists."""
    try:
        meta = json.loads((out_dir / META_FILENAME).read_text(encoding="utf-8"))
        if "parts" in meta:
            return [out_dir / p["folder"] for p in meta["parts"]]
        return [out_dir / a["file"] for a in meta["arrays"].values()] + [
            out_dir / meta["ids_file"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def remove(paths: Iterable[epath.Path], keep: Iterable[str] = ()) -> None:
    """Deletes ``paths`` (files or folders), except the names in ``keep``."""
    keep = set(keep)
    for path in paths:
        if path.name in keep:
            continue
        with contextlib.suppress(OSError):
            if not path.is_dir():
                path.unlink(missing_ok=True)
            elif storage.is_remote(path):
                path.rmtree()
            else:
                shutil.rmtree(os.fspath(path))


def _write_own(writer, batches: Batches, start: int, stop: int, num_rows: int, what: str,
               state: dict) -> None:
    if callable(batches):  # only this process's rows: no collective inside
        position = start
        for ids, blocks in (batches(start, stop) if stop > start else ()):
            writer.write(position - start, blocks, ids)
            position += len(ids)
        return
    # Every process iterates every block (the producer may hold collectives); each block's
    # outcome is exchanged, so a bad row stops all processes at the same block.
    position, state["phase"] = 0, "loop"
    for ids, blocks in batches:
        lo, hi = max(position, start), min(position + len(ids), stop)
        error = None
        try:
            if lo < hi:
                writer.write(lo - start, {k: v[lo - position:hi - position]
                                          for k, v in blocks.items()},
                             ids[lo - position:hi - position])
        except Exception as err:
            error = err
        multihost.agree(error, what)
        position += len(ids)
    state["phase"] = "after"
    if position != num_rows:
        raise ValueError(f"{what}: the blocks hold {position} rows, {num_rows} expected; "
                         "nothing exported")


def write_parts(out_dir: str | os.PathLike, batches: Batches, num_rows: int,
                dims: Mapping[str, int], meta: Mapping[str, Any] | None = None,
                ids_filename: str = "ids.txt",
                dtype: npt.DTypeLike = np.float32) -> dict[str, epath.Path]:
    """``out_dir`` as one part per process with rows (a collective), ``meta.json`` last;
    returns ``{"meta": path}``. Raises as ``EmbeddingWriter``, on every process."""
    out_dir = storage.as_path(out_dir)
    index, count = jax.process_index(), jax.process_count()
    start, stop = multihost.process_rows(num_rows)
    what = f"export to {storage.display(out_dir)}"
    mine = out_dir / part_name(index, count)
    # Raises on bad arguments (dims, meta keys) as the single writer does, everywhere alike.
    EmbeddingWriter(mine, dims, max(stop - start, 1), dtype, ids_filename=ids_filename,
                    meta=dict(meta or {}))
    writer = EmbeddingWriter(mine, dims, max(stop - start, 1), dtype,
                             ids_filename=ids_filename,
                             meta={"part": index, "of": count, "first_row": start})
    writer.first_row = start
    previous = listed_files(out_dir) if multihost.is_primary() else []
    error, state = None, {"phase": "before"}
    try:
        if stop > start:
            with writer:
                _write_own(writer, batches, start, stop, num_rows, what, state)
        else:
            _write_own(None, batches, start, stop, num_rows, what, state)
    except Exception as err:
        if state["phase"] == "loop":
            raise  # every process stopped at the same block
        error = err
    parts: list[dict] = []
    try:
        statuses = multihost.agree(error, what, rows=stop - start,
                                   part=mine.name if stop > start else None)
        if multihost.is_primary():
            try:
                parts = [{"folder": s["part"], "num_rows": s["rows"]} for s in statuses
                         if s["rows"]]
                _write_manifest(out_dir, parts, num_rows, dims, dtype, ids_filename, meta,
                                FORMAT_VERSION)
            except Exception as err:
                error = err
        multihost.agree(error, what)
    except Exception:  # raised on every process alike
        remove([mine])
        multihost.agree(None, what)  # every part is gone now
        if multihost.is_primary():
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if empty
        raise
    if multihost.is_primary():
        remove(previous, keep=[p["folder"] for p in parts])
    return {"meta": out_dir / META_FILENAME}


def _write_manifest(out_dir: epath.Path, parts: list[dict], num_rows: int,
                    dims: Mapping[str, int], dtype: npt.DTypeLike, ids_filename: str,
                    meta: Mapping[str, Any] | None, single_version: int) -> None:
    dtype = np.dtype(dtype)
    manifest = dict(meta or {})
    manifest.update(
        format_version=PARTS_FORMAT_VERSION, num_rows=num_rows,
        arrays={n: {"shape": [num_rows, int(d)], "dtype": dtype.name} for n, d in dims.items()},
        ids_file=ids_filename, created_utc=_utc_now(), parts=parts,
        part_format_version=single_version)
    write_json(out_dir / META_FILENAME, manifest)
