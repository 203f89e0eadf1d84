"""Atomic file writes: locally a temporary file renamed over, on ``gs://`` one upload."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from embedding_core.storage import storage


def default_file_mode() -> int:
    """``0o666`` minus the process umask (what ``open(path, "w")`` creates)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def make_readable(path: str | os.PathLike) -> None:
    """Gives ``path`` the default file mode (undoes ``tempfile.mkstemp``'s 0600)."""
    os.chmod(path, default_file_mode())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` (local or ``gs://``) atomically, creating the parent."""
    path = storage.as_path(path)
    if storage.is_remote(path):
        storage.write_bytes(path, data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` (UTF-8, line ends as given) to ``path`` atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Indented, key-sorted JSON, atomically. Raises TypeError (nothing written)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """One string a line, atomically. Raises ValueError: a line holding a line break."""
    out = []
    for i, line in enumerate(lines):
        if "\n" in line or "\r" in line:
            raise ValueError(f"{path}: line {i + 1} would contain a line break: {line!r}")
        out.append(line + "\n")
    write_text_atomic(path, "".join(out))


def read_json_object(path: str | os.PathLike, missing_hint: str = "") -> dict[str, Any]:
    """A JSON object file. Raises FileNotFoundError (with ``missing_hint``); ValueError:
    not UTF-8 JSON, or not an object."""
    path = storage.as_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found{': ' + missing_hint if missing_hint else ''}")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def check_not_an_input(output: str | os.PathLike, inputs: dict[str, Any]) -> None:
    """Raises ValueError naming the flag when ``output`` is one of ``inputs`` (``{"--flag":
    path or None}``) or lies inside an input folder: writing it would destroy that input."""
    out = os.path.normpath(os.fspath(storage.display(output)))
    for flag, value in inputs.items():
        if value is None or value == "":
            continue
        src = os.path.normpath(os.fspath(storage.display(value)))
        if out == src or out.startswith(src.rstrip("/") + "/"):
            raise ValueError(f"--output={storage.display(output)} would overwrite "
                             f"{flag}={storage.display(value)}; write elsewhere")
