"""Reading exports written by ``embedding_core.serving.export``: array folders, views, manifests."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from etils import epath

from embedding_core.storage import storage

META_FILENAME = "meta.json"
MANIFEST_FILENAME = "export.json"
VIEW_ARRAY = "embeddings"


def load_arrays(out_dir: str | os.PathLike, mmap_mode: str | None = None
                ) -> tuple[dict[str, np.ndarray], list[str], dict[str, Any]]:
    """``({name: [num_rows, dim]}, ids, meta)`` of an array folder (parts concatenated).
    Raises FileNotFoundError; ValueError: a file disagrees with ``meta.json``."""
    out_dir = storage.as_path(out_dir)
    meta = _read_meta(out_dir)
    if "parts" in meta:
        parts = _part_list(out_dir, meta, mmap_mode)
        return ({name: np.concatenate([a[name] for a, _ in parts]) for name in meta["arrays"]},
                [i for _, ids in parts for i in ids], meta)
    return _load_single(out_dir, meta, mmap_mode)


class IdsFile:
    """An ids file counted, not read (``len``); :meth:`lines` streams its ids."""

    def __init__(self, path: epath.Path, count: int) -> None:
        self.path, self.count = path, count

    def __len__(self) -> int:
        return self.count

    def lines(self) -> Iterator[str]:
        """The ids in order. Raises ValueError: not UTF-8."""
        with self.path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    yield raw.decode("utf-8").removesuffix("\n")
                except UnicodeDecodeError as err:
                    raise ValueError(f"{self.path}:{number}: not UTF-8 ({err.reason})") from None


def load_parts(out_dir: str | os.PathLike, mmap_mode: str | None = None, *,
               read_ids: bool = True
               ) -> tuple[list[tuple[dict[str, np.ndarray], list[str] | IdsFile]],
                          dict[str, Any]]:
    """``([(arrays, ids) of each part, in row order], meta)`` of an array folder, nothing
    concatenated (a folder without parts is one part), so a reader can stream the rows;
    ``read_ids=False``: each part's ids as an :class:`IdsFile` (counted, not held).
    Raises as :func:`load_arrays`; a missing part: FileNotFoundError naming it."""
    out_dir = storage.as_path(out_dir)
    meta = _read_meta(out_dir)
    if "parts" in meta:
        return _part_list(out_dir, meta, mmap_mode, read_ids), meta
    arrays, ids, meta = _load_single(out_dir, meta, mmap_mode, read_ids)
    return [(arrays, ids)], meta


def _read_meta(out_dir: epath.Path) -> dict[str, Any]:
    meta_path = out_dir / META_FILENAME
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no {META_FILENAME}; not an export directory")
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_path}: not valid JSON ({err})") from None
    try:
        int(meta["num_rows"]), meta["arrays"], meta["ids_file"]
    except KeyError as e:
        raise ValueError(f"{meta_path}: missing field {e}") from e
    return meta


def _load_single(out_dir: epath.Path, meta: dict[str, Any], mmap_mode: str | None,
                 read_ids: bool = True) -> tuple[dict[str, np.ndarray], Any, dict[str, Any]]:
    meta_path = out_dir / META_FILENAME
    num_rows, spec, ids_file = int(meta["num_rows"]), meta["arrays"], meta["ids_file"]
    arrays = {}
    for name, info in spec.items():
        path = out_dir / info["file"]
        arr = _load_npy(path, mmap_mode)
        if list(arr.shape) != list(info["shape"]) or arr.dtype.name != info["dtype"]:
            raise ValueError(
                f"{path}: shape {list(arr.shape)} dtype {arr.dtype.name} disagrees with "
                f"{meta_path} field 'arrays.{name}' ({info['shape']}, {info['dtype']})")
        arrays[name] = arr
    ids_path = out_dir / ids_file
    if not read_ids:
        ids = IdsFile(ids_path, _count_lines(ids_path))
        if len(ids) != num_rows:
            raise ValueError(f"{ids_path}: {len(ids)} ids, but {meta_path} field 'num_rows' "
                             f"is {num_rows}")
        return arrays, ids, meta
    try:
        text = ids_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{ids_path}: not UTF-8 ({err.reason})") from None
    if text and not text.endswith("\n"):
        raise ValueError(f"{ids_path}: last line has no newline; the file is truncated")
    ids = text.split("\n")[:-1]
    if len(ids) != num_rows:
        raise ValueError(
            f"{ids_path}: {len(ids)} ids, but {meta_path} field 'num_rows' is {num_rows}")
    return arrays, ids, meta


def _count_lines(path: epath.Path) -> int:
    count, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            count += block.count(b"\n")
            last = block[-1:]
    if last != b"\n":
        raise ValueError(f"{path}: last line has no newline; the file is truncated")
    return count


def _part_list(out_dir: epath.Path, meta: dict[str, Any], mmap_mode: str | None,
               read_ids: bool = True) -> list[tuple[dict[str, np.ndarray], Any]]:
    where = out_dir / META_FILENAME
    names = sorted(meta["arrays"])
    parts = []
    for part in meta["parts"]:
        part_dir = out_dir / part["folder"]
        part_meta = _read_meta(part_dir)
        arrays, part_ids, _ = ({}, [], None) if "parts" in part_meta else \
            _load_single(part_dir, part_meta, mmap_mode, read_ids)
        if "parts" in part_meta or len(part_ids) != part["num_rows"] or sorted(arrays) != names:
            raise ValueError(f"{out_dir / part['folder']}: its rows or arrays disagree with "
                             f"{where} field 'parts'")
        parts.append((arrays, part_ids))
    rows = sum(len(ids) for _, ids in parts)
    for name in names:
        info = meta["arrays"][name]
        tails = {tuple(a[name].shape[1:]) for a, _ in parts}
        dtypes = {a[name].dtype.name for a, _ in parts}
        shape = [rows, *next(iter(tails))] if len(tails) == 1 else None
        if shape != list(info["shape"]) or dtypes != {info["dtype"]}:
            raise ValueError(f"{out_dir}: parts of shape {shape or sorted(tails)} dtype "
                             f"{'/'.join(sorted(dtypes))} disagree with {where} field "
                             f"'arrays.{name}'")
    if rows != int(meta["num_rows"]):
        raise ValueError(f"{out_dir}: {rows} ids in the parts, but {where} field "
                         f"'num_rows' is {meta['num_rows']}")
    return parts


def _load_npy(path: epath.Path, mmap_mode: str | None) -> np.ndarray:
    if storage.is_remote(path):
        return np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
    return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


def load_view(out_dir: str | os.PathLike, mmap_mode: str | None = None
              ) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """``(embeddings [N, dim] float32, ids, meta)`` of one view folder."""
    arrays, ids, meta = load_arrays(out_dir, mmap_mode)
    if VIEW_ARRAY not in arrays:
        raise ValueError(f"{out_dir}: not a view folder (arrays {sorted(arrays)}, expected "
                         f"{VIEW_ARRAY!r})")
    return arrays[VIEW_ARRAY], ids, meta


def load_export(out_dir: str | os.PathLike, mmap_mode: str | None = None
                ) -> dict[str, tuple[np.ndarray, list[str], dict[str, Any]]]:
    """``{view name: (embeddings, ids, meta)}`` of an export (or one view) folder.

    Raises: FileNotFoundError: no view, or a listed one missing. ValueError: an unfinished
    export, a view of another export, files that disagree with their ``meta.json``."""
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
