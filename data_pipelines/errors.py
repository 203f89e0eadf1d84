"""Re-export: the core owns ``DataError`` (``embedding_core.errors``)."""

from embedding_core.errors import DataError

__all__ = ["DataError"]
