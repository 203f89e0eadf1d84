"""Where the shipped data lives (``$EMBEDDING_JAX_DATA``), with storage's cache helpers."""

from __future__ import annotations

import os
from pathlib import Path

from embedding_core.storage.storage import CACHE_ENV, absolute_data_paths, cache_dir  # noqa: F401

DATA_ENV = "EMBEDDING_JAX_DATA"


def data_dir() -> Path:
    """``$EMBEDDING_JAX_DATA``, else the repository's ``data/``; FileNotFoundError saying what to
    set."""
    env = os.environ.get(DATA_ENV)
    path = Path(env).expanduser() if env else Path(__file__).resolve().parents[1] / "data"
    if not path.is_dir():
        source = f"${DATA_ENV}" if env else "the repository's data/ folder (editable install)"
        raise FileNotFoundError(
            f"data folder {path} (from {source}) does not exist; set {DATA_ENV} to the folder "
            "that holds inli/, snli/, squad/ and movielens/ (a copy of the repository's data/)"
        )
    return path
