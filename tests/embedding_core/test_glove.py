"""The shared GloVe loader: row lookup, duplicate words, and clear errors on bad folders."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedding_core.models.glove import MATRIX_FILE, VOCAB_FILE, GloveVectors


def _write(folder, matrix, words, columns=("word",)):
    np.save(folder / MATRIX_FILE, np.asarray(matrix, np.float32))
    pq.write_table(pa.table({c: words for c in columns}), folder / VOCAB_FILE)


def test_rows_duplicates_and_oov(tmp_path):
    _write(tmp_path, [[1, 2], [3, 4], [5, 6]], ["the", "cat", "the"])
    glove = GloveVectors(tmp_path)
    assert glove.dim == 2 and glove.index == {"the": 0, "cat": 1}  # first row wins
    np.testing.assert_array_equal(glove.word_vectors(["cat", "zzz", "the"]),
                                  [[3, 4], [0, 0], [1, 2]])
    assert glove.word_vectors([]).shape == (0, 2)


def test_missing_file_names_the_path(tmp_path):
    np.save(tmp_path / MATRIX_FILE, np.zeros((2, 3), np.float32))
    with pytest.raises(FileNotFoundError, match=VOCAB_FILE):
        GloveVectors(tmp_path)


def test_files_that_disagree(tmp_path):
    _write(tmp_path, [[1, 2], [3, 4]], ["a", "b", "c"])
    with pytest.raises(ValueError, match="3 words but .* shape \\(2, 2\\)"):
        GloveVectors(tmp_path)
    _write(tmp_path, [[1, 2], [3, 4]], ["a", "b"], columns=("word", "extra"))
    with pytest.raises(ValueError, match="one string column"):
        GloveVectors(tmp_path)
