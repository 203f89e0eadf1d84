"""Multi-resolution word embeddings with ConvRR / FCRR retrieval (docs/mrwe.md)."""
from embedding_core import method_entry_points

train, load, config_fields = method_entry_points(__name__)  # each loads its module on use
__all__ = ["train", "load"]
