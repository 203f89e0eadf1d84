"""Using a trained encoder: loading, encoding, exports and the sentence-transformers formats."""
