"""Which installed method trained a workdir, and its loaded encoder: each package declares
itself under the ``embedding_jax.methods`` entry-point group (``pyproject.toml``), with a
``load(workdir, step=)`` and a ``config_fields()``; the run config's field names tell the
methods apart (``docs/models.md``, "load_encoder").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import Any

from embedding_core import configs, storage
from embedding_core.files import read_json_object

GROUP = "embedding_jax.methods"


def is_workdir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (local or ``gs://``) holds a run config (``configs.config_path``)."""
    folder = storage.as_path(path)
    return folder.is_dir() and configs.config_path(folder).is_file()


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
    path = configs.config_path(storage.as_path(workdir))
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
