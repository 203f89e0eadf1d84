"""DocEnt: entity representations learned from the documents about each entity (docs/docent.md)."""
from embedding_core import method_entry_points

train, load, config_fields = method_entry_points(__name__)  # each loads its module on use
__all__ = ["train", "load"]
