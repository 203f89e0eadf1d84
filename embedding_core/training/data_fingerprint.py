"""``WORKDIR/data_fingerprint.json``: size, mtime and content hash of every training-data
file, so that a resume on changed data is refused (``docs/architecture.md``, "Resuming on
changed data")."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping

import ml_collections

from embedding_core.fields import Fields
from embedding_core.storage import storage

FILE = "data_fingerprint.json"
RACY_S = 2.0  # seconds: a ctime this close to the recording is not trusted


class DataChangedError(ValueError):
    """A training-data file differs from the one the run in the workdir started on."""


def data_fields(config: ml_collections.ConfigDict, fields: Fields | None) -> list[str]:
    """The config's training-data fields (``Field(data=True)``) that are set."""
    return [n for n, f in (fields or {}).items()
            if getattr(f, "data", False) and n in config and str(config[n] or "").strip()]


def _paths(value: str) -> list[str]:
    return [p.strip() for p in str(value).split(",") if p.strip()]


def _files(path: str, above: frozenset[str] = frozenset()) -> Iterator[tuple[str, object]]:
    """``(uri, epath.Path)`` of ``path`` or every file under it, sorted. Raises
    FileNotFoundError (also a broken link); ValueError: a link to a folder above it, a FIFO."""
    root = storage.as_path(path)
    local = not storage.is_remote(path)
    if root.is_dir():
        real = os.path.realpath(path) if local else os.fspath(path)
        if real in above:
            raise ValueError(f"{path} is a link to {real}, a folder it is in: a loop; remove "
                             "the link")
        for child in sorted(root.iterdir(), key=lambda p: p.name):
            if not child.name.startswith("."):  # .DS_Store, editors' files: not data
                yield from _files(os.fspath(child), above | {real})
    elif root.exists():
        if local and not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the hash
            raise ValueError(f"{path} is not a regular file (a FIFO, socket or device); a data "
                             "folder holds data files only")
        yield os.fspath(root), root
    elif local and os.path.islink(path):
        raise FileNotFoundError(f"{path} is a broken symbolic link (to {os.readlink(path)}); "
                                "remove it or restore its target")
    else:
        raise FileNotFoundError(f"{path} does not exist")


def _stat(path) -> dict:
    """``size``, ``mtime`` and ``stamp`` (``"inode:mtime_ns:ctime_ns"``, None while racy;
    on ``gs://`` the generation)."""
    if storage.is_remote(path):
        import fsspec

        info = fsspec.filesystem("gs").info(os.fspath(path))
        generation = float(info.get("generation") or 0)
        return {"size": int(info.get("size") or 0), "mtime": generation,
                "stamp": f"gs:{info.get('generation')}" if info.get("generation") else None}
    st = os.stat(os.fspath(path))
    racy = time.time_ns() - st.st_ctime_ns < RACY_S * 1e9
    return {"size": st.st_size, "mtime": st.st_mtime,
            "stamp": None if racy else f"{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"}


def fingerprint(config: ml_collections.ConfigDict, names: Iterable[str],
                known: Mapping[str, dict] | None = None) -> dict[str, dict[str, dict]]:
    """``{field: {file: {"size", "mtime", "stamp", "hash"}}}``; a file with ``known``'s size
    and stamp keeps its hash unread. Raises FileNotFoundError, ValueError (a link loop)."""
    out: dict[str, dict[str, dict]] = {}
    for name in names:
        files: dict[str, dict] = {}
        storage.check_data_paths(config, [name])  # the CLI's own one line for a missing path
        for path in _paths(config[name]):
            try:
                found = list(_files(path))
            except (FileNotFoundError, ValueError) as err:  # under a folder: name the field
                raise type(err)(f"config.{name}: {err}") from None
            for uri, one in found:
                now = _stat(one)
                old = ((known or {}).get(name) or {}).get(uri)
                same = (old and now["stamp"] is not None and old.get("size") == now["size"]
                        and old.get("stamp") == now["stamp"])
                files[uri] = {**now, "hash": old["hash"] if same else storage.content_hash(one)}
        out[name] = files
    return out


def read(file) -> dict[str, dict[str, dict]]:
    """A saved fingerprint. Raises ValueError: not JSON or not a fingerprint."""
    from embedding_core.storage.files import read_json_object

    way_out = "delete it to record the data as it is now, or use a new --workdir"
    try:
        saved = read_json_object(file)
    except ValueError as err:
        raise ValueError(f"{err}; {way_out}") from None
    for name, files in saved.items():
        keys = {"size", "mtime", "hash"}
        if not isinstance(files, dict) or not all(
                isinstance(v, dict) and keys <= set(v) for v in files.values()):
            raise ValueError(f"{file}: {name!r} is not {{file: {{size, mtime, hash}}}}; {way_out}")
    return saved


def changes(saved: Mapping[str, dict], now: Mapping[str, dict]) -> list[str]:
    """``config.F: FILE (what changed)`` per change (mtime alone is none)."""
    out = []
    for name in sorted(set(saved) | set(now)):
        before, after = saved.get(name) or {}, now.get(name) or {}
        for uri in sorted(set(before) | set(after)):
            old, new = before.get(uri), after.get(uri)
            if old is None:
                out.append(f"config.{name}: {uri} is new")
            elif new is None:
                out.append(f"config.{name}: {uri} is gone")
            elif old.get("size") != new.get("size"):
                out.append(f"config.{name}: {uri} changed ({old.get('size')} -> "
                           f"{new.get('size')} bytes)")
            elif old.get("hash") != new.get("hash"):
                out.append(f"config.{name}: {uri} changed (same size, other content)")
    return out


def path(workdir) -> object:
    """Where the run's fingerprint lives."""
    return storage.as_path(workdir) / FILE
