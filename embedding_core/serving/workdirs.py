"""A workdir's run config, the installed method (``embedding_jax.methods`` entry points,
told apart by config fields) that trained it, and its encoder (``docs/models.md``)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from typing import Any

from etils import epath

from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object

CONFIG_FILE = "run_config.json"  # never config.json: Hugging Face tools take it for theirs
LEGACY_CONFIG_FILE = "config.json"  # of workdirs written before run_config.json
GROUP = "embedding_jax.methods"


def method_entry_points(package: str) -> tuple:
    """``(train, load, config_fields)`` of a method package laid out as
    ``docs/architecture.md`` says (``trainer.train``, ``inference.load``,
    ``configs.default.FIELDS``), each importing its module on first use (no JAX on import)."""

    def train(config, workdir, **kwargs):
        return importlib.import_module(f"{package}.trainer").train(config, workdir, **kwargs)

    def load(workdir, **kwargs):
        return importlib.import_module(f"{package}.inference").load(workdir, **kwargs)

    def config_fields() -> list[str]:
        return list(importlib.import_module(f"{package}.configs.default").FIELDS)

    return train, load, config_fields


def is_workdir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a run config."""
    folder = storage.as_path(path)
    return folder.is_dir() and config_path(folder).is_file()


def methods() -> dict[str, Any]:
    """``{name: package module}`` of every installed method."""
    found = {}
    for point in importlib.metadata.entry_points(group=GROUP):
        found[point.name] = importlib.import_module(point.value)
    return found


def method_of(workdir: str | os.PathLike) -> str:
    """The installed method lacking fewest (at most 3) of the run config's fields.
    Raises ValueError: none matches."""
    path = config_path(storage.as_path(workdir))
    saved = set(read_json_object(path))
    scored = sorted((len(saved - set(module.config_fields())), name)
                    for name, module in methods().items())
    if not scored or scored[0][0] > 3:
        raise ValueError(f"{storage.display(path)}: no installed method has these config "
                         f"fields (installed: {sorted(methods()) or 'none'})")
    return scored[0][1]


def load_workdir(workdir: str | os.PathLike, *, step: int | None = None) -> Any:
    """Its package's ``load(workdir, step=step)``. Raises ValueError (:func:`method_of`)."""
    return methods()[method_of(workdir)].load(workdir, step=step)


def config_path(workdir: str | os.PathLike) -> epath.Path:
    """``run_config.json``, else an older ``config.json`` that is no HF model config."""
    workdir = storage.as_path(workdir)
    path = workdir / CONFIG_FILE
    legacy = workdir / LEGACY_CONFIG_FILE
    if path.is_file() or not legacy.is_file():
        return path
    try:
        raw = json.loads(legacy.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return legacy
    return path if isinstance(raw, dict) and "model_type" in raw else legacy
