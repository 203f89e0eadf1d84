"""Word sources and their cached per-text features (multi-resolution word embeddings)."""
