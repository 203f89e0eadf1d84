"""sentence-transformers' training on a mesh: its data columns, losses, samplers and folders,
for any encoder ``load_encoder`` accepts (``docs/sentence.md``)."""
from embedding_core import method_entry_points

train, load, config_fields = method_entry_points(__name__)  # each loads its module on use
__all__ = ["train", "load"]
