"""Streaming, atomic export of embeddings: ``<name>.npy``, ``ids.txt``, ``meta.json``,
views and ``export.json`` (``docs/architecture.md``, "One export layout"); the readers
(``export_reader``) are re-exported here."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath
from tqdm.auto import tqdm

from embedding_core.distributed import multihost
from embedding_core.serving import export_parts
from embedding_core.serving.embedding_writer import (  # noqa: F401
    FORMAT_VERSION,
    SIMILARITIES,
    VIEW_META_KEYS,
    EmbeddingWriter,
    _check_filename,
    _CheckingWriter,
    _utc_now,
)
from embedding_core.serving.export_reader import (  # noqa: F401
    MANIFEST_FILENAME,
    META_FILENAME,
    VIEW_ARRAY,
    load_arrays,
    load_export,
    load_view,
)
from embedding_core.storage import storage
from embedding_core.storage.files import write_bytes_atomic, write_json

# (ids, [b, dim]) blocks in row order, or (start, stop) -> those of rows [start, stop).
ViewBlocks = (Iterable[tuple[Sequence[str], np.ndarray]]
              | Callable[[int, int], Iterable[tuple[Sequence[str], np.ndarray]]])


def export_embeddings(out_dir: str | os.PathLike, batches: export_parts.Batches,
                      num_rows: int, dims: Mapping[str, int],
                      meta: Mapping[str, Any] | None = None,
                      ids_filename: str = "ids.txt", *, split: bool = True
                      ) -> dict[str, epath.Path]:
    """Writes ``(ids, {name: [b, dim]})`` batches (or ``(start, stop) ->`` them) as one
    folder: one file per array, or with several processes and ``split`` one part each.
    Returns ``{name: path, "ids": path, "meta": path}``. Raises ValueError (nothing left)."""
    if split and jax.process_count() > 1:
        return export_parts.write_parts(out_dir, batches, num_rows, dims, meta, ids_filename)
    if callable(batches):
        batches = batches(0, num_rows)
    primary = multihost.is_primary()
    previous = export_parts.listed_files(storage.as_path(out_dir)) if primary else []
    writer = (EmbeddingWriter if primary else _CheckingWriter)(
        out_dir, dims, num_rows, ids_filename=ids_filename, meta=meta)
    with writer, tqdm(total=num_rows, unit="row", desc=f"export {out_dir}",
                      disable=not primary or None) as bar:
        start = 0
        for ids, blocks in batches:
            writer.write(start, blocks, ids)
            start += len(ids)
            bar.update(len(ids))
    export_parts.remove(previous, keep=[p.name for p in writer.output_paths.values()])
    return writer.output_paths


def export_view(out_dir: str | os.PathLike, blocks: ViewBlocks, *, num_rows: int, dim: int,
                meta: Mapping[str, Any], split: bool = True) -> dict[str, epath.Path]:
    """One view folder from ``(ids, [b, dim])`` blocks (:func:`export_embeddings`); ``meta``
    holds :data:`VIEW_META_KEYS`. Raises ValueError: missing keys, an unknown similarity."""
    missing = [k for k in VIEW_META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"export meta lacks {missing}")
    if meta["similarity"] not in SIMILARITIES:
        raise ValueError(f"meta similarity={meta['similarity']!r}: use one of {SIMILARITIES}")

    def arrays(parts):
        return ((ids, {VIEW_ARRAY: v}) for ids, v in parts)

    batches = (lambda a, b: arrays(blocks(a, b))) if callable(blocks) else arrays(blocks)
    return export_embeddings(out_dir, batches, num_rows=num_rows, dims={VIEW_ARRAY: dim},
                             meta=dict(meta), split=split)


class ExportFolder:
    """An export of several views, consistent as a whole: ``export.json`` incomplete on
    entry, complete on a clean exit. Raises FileExistsError: a file in the way."""

    def __init__(self, output: str | os.PathLike) -> None:
        self.output = storage.as_path(output)
        for path in (self.output, *self.output.parents):  # a file in the way, at any level
            if path.exists():
                if not path.is_dir():
                    where = "" if path == self.output else f": {path}"
                    raise FileExistsError(f"--output {self.output}{where} exists and is not "
                                          "a folder")
                break
        self.export_id = uuid.uuid4().hex
        self.views: list[str] = []

    def tag(self, name: str) -> dict[str, str]:
        """Registers view ``name``; returns the meta entries tying it to this export."""
        _check_filename(name, "view name")
        if name == MANIFEST_FILENAME or name in self.views:
            raise ValueError(f"view name {name!r} is reserved or used twice")
        if (self.output / name).is_file():
            raise FileExistsError(f"--output {self.output}: {self.output / name} is a file, "
                                  f"where the view {name!r} goes")
        self.views.append(name)
        return {"export_id": self.export_id}

    def view(self, name: str, blocks: ViewBlocks, *,
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
