"""Shared machinery of the three models (see docs/architecture.md).

Importing the package wires storage first (:func:`embedding_core.storage.configure`), so a
``gs://`` path and ``STORAGE_EMULATOR_HOST`` work the same for library users and the CLIs.
"""

from embedding_core import storage as _storage

_storage.configure()
