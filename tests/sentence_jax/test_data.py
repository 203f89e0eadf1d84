"""Training files in sentence-transformers' conventions: the same rows from JSON Lines, CSV
and Parquet; columns by position; label / score; one line naming file, line and column for
a row that does not fit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedding_core import DataError
from sentence_jax.data import read_columns

ROWS = [{"anchor": "a cat sits", "positive": "a cat is sitting", "negative": "a dog runs"},
        {"anchor": "rain falls", "positive": "it rains", "negative": "the sun shines"}]


def _write(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".csv":
        import csv

        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_the_three_formats_give_the_same_columns(tmp_path, suffix):
    cols = read_columns(_write(tmp_path / f"t{suffix}", ROWS))
    assert cols.names == ("anchor", "positive", "negative")
    assert cols.texts == [tuple(r.values()) for r in ROWS] and cols.labels is None
    assert cols.lines.tolist() == ([2, 3] if suffix == ".csv" else [1, 2])


def test_a_score_column_anywhere_is_the_label(tmp_path):
    rows = [{"score": 0.5, "sentence1": "a", "sentence2": "b"},
            {"score": 1, "sentence1": "c", "sentence2": "d"}]
    cols = read_columns(_write(tmp_path / "s.jsonl", rows), max_columns=2, needs_label=True)
    assert cols.names == ("sentence1", "sentence2") and cols.label_name == "score"
    np.testing.assert_array_equal(cols.labels, np.array([0.5, 1.0], np.float32))


@pytest.mark.parametrize("rows,kwargs,where,reason", [
    ([{"anchor": "a"}], {}, ":1:",
     "1 text column(s) ['anchor']; the loss takes at least 2 (anchor, positive, then negatives)"),
    ([{"a": "x", "b": "y", "c": "z"}], {"max_columns": 2, "needs_label": True}, ":1:",
     "3 text column(s) ['a', 'b', 'c']; the loss takes 2 (two texts and a label or score)"),
    ([{"a": "x", "b": "y"}], {"max_columns": 2, "needs_label": True}, ":1:",
     "no 'label' or 'score' column"),
    ([{"a": "x", "b": "y"}, {"a": "x", "c": "y"}], {}, ":2: field 'b':",
     "the columns differ from the first row's (missing: ['b'])"),
    ([{"a": "x", "b": "y"}, {"a": "x", "b": 3}], {}, ":2: field 'b':",
     "a text column holds int 3, not a string"),
    ([{"a": "x", "b": "y"}, {"a": "x", "b": " "}], {}, ":2: field 'b':", "empty text"),
    ([{"a": "x", "b": "y", "label": "high"}], {}, ":1: field 'label':", "not a number: 'high'"),
])
def test_a_row_that_does_not_fit_is_one_line(tmp_path, rows, kwargs, where, reason):
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as err:
        read_columns(path, **kwargs)
    assert f"{path}{where}" in str(err.value) and reason in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_suffix_and_a_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"unknown file type '\.txt'"):
        read_columns(tmp_path / "x.txt")
    with pytest.raises(FileNotFoundError, match="nope.csv does not exist"):
        read_columns(tmp_path / "nope.csv")


def test_the_package_imports_the_core_only_through_its_public_surface():
    """As tests/fourth_method shows: ``embedding_core`` itself, names on its ``__all__``."""
    from pathlib import Path

    import sentence_jax
    from tests.surface_imports import outside_surface

    files = sorted(Path(sentence_jax.__file__).parent.rglob("*.py"))
    assert len(files) > 8 and [b for path in files for b in outside_surface(path)] == []
