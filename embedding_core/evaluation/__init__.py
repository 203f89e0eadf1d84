"""Evaluators that give sentence-transformers' numbers for our encoders and theirs."""
