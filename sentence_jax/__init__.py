"""sentence-transformers' training on a mesh: its data columns, losses, samplers, prompts and
folders, for any encoder ``load_encoder`` accepts (``docs/sentence.md``)."""
