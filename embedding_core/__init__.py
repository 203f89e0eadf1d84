"""Shared machinery of the three models (see docs/architecture.md).

Importing the package wires storage first (:func:`embedding_core.storage.storage.configure`), so a
``gs://`` path and ``STORAGE_EMULATOR_HOST`` work the same for library users and the CLIs.
"""

from embedding_core.storage import storage as _storage

_storage.configure()


def load_encoder(name_or_path, *, truncate_dim=None):
    """A pretrained encoder (folder, ``gs://``, installed package or hub id) as an
    ``inference.Encoder`` with ``SentenceTransformer.encode``'s arguments;
    ``truncate_dim``: ``encode``'s default (``embedding_core.serving.st_models.load_encoder``)."""
    from embedding_core.serving.st_models import load_encoder as _load

    return _load(name_or_path, truncate_dim=truncate_dim)
