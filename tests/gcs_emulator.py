"""The tests' GCS emulator: the shipped one (``embedding_core/storage/gcs_emulator.py``)."""

from embedding_core.storage.gcs_emulator import BUCKET, GcsEmulator  # noqa: F401
