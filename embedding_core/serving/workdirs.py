"""What a workdir holds: its run config file, the installed method that trained it, and its
loaded encoder. Each package declares itself under the ``embedding_jax.methods`` entry-point
group (``pyproject.toml``), with a ``load(workdir, step=)`` and a ``config_fields()``; the
run config's field names tell the methods apart (``docs/models.md``, "load_encoder").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from typing import Any

from etils import epath

from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object

CONFIG_FILE = "run_config.json"
"""The run's own config in a workdir; never ``config.json``, the name Hugging Face tools
take for a model's config (``docs/architecture.md``, "What a workdir holds")."""
LEGACY_CONFIG_FILE = "config.json"
"""Where workdirs written before ``run_config.json`` keep their run config."""
GROUP = "embedding_jax.methods"


def is_workdir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (local or ``gs://``) holds a run config (``config_path``)."""
    folder = storage.as_path(path)
    return folder.is_dir() and config_path(folder).is_file()


def methods() -> dict[str, Any]:
    """``{name: package module}`` of every installed method."""
    found = {}
    for point in importlib.metadata.entry_points(group=GROUP):
        found[point.name] = importlib.import_module(point.value)
    return found


def method_of(workdir: str | os.PathLike) -> str:
    """The installed method whose config fields cover the workdir's run config (at most 3
    fields it lacks, as ``configs.check_resume``; the fewest wins).

    Raises:
      ValueError: no installed method matches (the file and the methods named).
    """
    path = config_path(storage.as_path(workdir))
    saved = set(read_json_object(path))
    scored = sorted((len(saved - set(module.config_fields())), name)
                    for name, module in methods().items())
    if not scored or scored[0][0] > 3:
        raise ValueError(f"{storage.display(path)}: no installed method has these config "
                         f"fields (installed: {sorted(methods()) or 'none'})")
    return scored[0][1]


def load_workdir(workdir: str | os.PathLike, *, step: int | None = None) -> Any:
    """The trained model in ``workdir`` as its package's ``load`` gives it (an
    ``inference.Encoder``; the latest checkpoint unless ``step``).

    Raises:
      ValueError: as :func:`method_of`; the package's ``load`` errors.
    """
    return methods()[method_of(workdir)].load(workdir, step=step)


def config_path(workdir: str | os.PathLike) -> epath.Path:
    """The file holding ``workdir``'s run config, local or ``gs://``.

    ``run_config.json`` when present; else an older workdir's ``config.json`` unless it is
    a Hugging Face model config (has ``model_type``); else the ``run_config.json`` path.
    """
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
