"""Where the shipped data and the local caches live; users' data paths saved with a run."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DATA_ENV = "EMBEDDING_JAX_DATA"
CACHE_ENV = "EMBEDDING_JAX_CACHE"


def data_dir() -> Path:
    """The folder holding the shipped data sets (``inli/``, ``snli/``, ``squad/``, ...).

    Returns ``$EMBEDDING_JAX_DATA`` if set, else the repository's ``data/`` folder next to
    this package (which exists in a source checkout or an editable install).

    Raises:
      FileNotFoundError: the folder does not exist; the message says what to set.
    """
    env = os.environ.get(DATA_ENV)
    path = Path(env).expanduser() if env else Path(__file__).resolve().parents[1] / "data"
    if not path.is_dir():
        source = f"${DATA_ENV}" if env else "the repository's data/ folder (editable install)"
        raise FileNotFoundError(
            f"data folder {path} (from {source}) does not exist; set {DATA_ENV} to the folder "
            "that holds inli/, snli/, squad/ and movielens/ (a copy of the repository's data/)"
        )
    return path


def cache_dir() -> Path:
    """The folder for derived, re-creatable files (token caches).

    Returns ``$EMBEDDING_JAX_CACHE`` if set, else ``~/.cache/embedding_jax``. The folder is
    not created here; writers create the subfolder they need.
    """
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "embedding_jax"


def absolute_data_paths(config, fields: Iterable[str]):
    """Makes the data-file fields of a config absolute, in place, and returns the config.

    Each named field holds a path or a comma-separated list of paths ("" = unset; a field
    the config lacks is skipped). Local paths are expanded (``~``) and resolved against the
    current directory; URIs (``gs://...``) are kept. Called when a run starts, so that the
    config saved with it names the same files from any directory (evaluate, resume).

    Args:
      config: an ``ml_collections.ConfigDict`` (or any mapping with ``get`` and item set).
      fields: names of its path fields.
    """
    for name in fields:
        if name not in config:
            continue
        parts = [p.strip() for p in str(config.get(name, "") or "").split(",") if p.strip()]
        config[name] = ",".join(p if "://" in p else str(Path(p).expanduser().resolve())
                                for p in parts)
    return config
