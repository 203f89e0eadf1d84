"""The shipped INLI and SNLI files, the ImpScore format and the data paths."""

from __future__ import annotations

import pytest

from data_pipelines import paths
from data_pipelines.impscore import read_impscore
from data_pipelines.inli import inli_split_path, read_inli
from data_pipelines.snli import read_snli_triplets, snli_triplets_path


@pytest.mark.parametrize("split,count", [("train", 8000), ("val", 1000), ("test", 1000)])
def test_inli_split_sizes(split, count):
    rows = read_inli(inli_split_path(split))
    assert len(rows) == count
    assert rows[-1].line == count + 1  # one physical line per row in the shipped files
    assert {r.dataset for r in rows} == {"circa", "ludwig", "normbank", "socialchem"}


def test_inli_test_first_row_exact():
    first = read_inli(inli_split_path("test"))[0]
    assert first.line == 2
    assert first.dataset == "normbank"
    assert first.premise == (
        "A wave of whispers followed Mrs. Lopez down the street as she casually tossed an "
        "empty chip bag onto her overgrown lawn, adding to the growing collection of "
        "discarded toys and fast-food containers littering her backyard."
    )
    # The file's column order is implied before explicit: check they are not swapped.
    assert first.implied_entailment == (
        "Mrs. Lopez's neighbors dislike how she neglects her property's upkeep."
    )
    assert first.explicit_entailment == (
        "The neighbors gossiped quietly, observing Mrs. Lopez's neglect of her property."
    )
    assert first.neutral == (
        "Mrs. Lopez's neighbors dislike her decision to plant flowers in her backyard."
    )
    assert first.contradiction == (
        "Mrs. Lopez's neighbors do not like her very careful lawn care routine."
    )


def test_inli_known_duplicates():
    test = read_inli(inli_split_path("test"))
    assert test[93].implied_entailment == test[93].explicit_entailment
    assert test[477].implied_entailment == test[477].explicit_entailment
    assert test[571].implied_entailment == test[571].contradiction


def test_inli_split_names():
    assert inli_split_path("validation") == inli_split_path("val")
    with pytest.raises(ValueError, match="unknown INLI split"):
        inli_split_path("dev")


def test_snli_triplets():
    rows = read_snli_triplets(snli_triplets_path())
    assert len(rows) == 27195
    assert (rows[0].sent0, rows[0].sent1, rows[0].hard_neg, rows[0].line) == (
        "A person on a horse jumps over a broken down airplane.",
        "A person is outdoors, on a horse.",
        "A person is at a diner, ordering an omelette.",
        2,
    )


def test_data_dir_env_and_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    assert (paths.data_dir() / "inli" / "test.csv").is_file()
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    assert paths.data_dir() == tmp_path
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=paths.DATA_ENV):
        paths.data_dir()
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "c"))
    assert paths.cache_dir() == tmp_path / "c"


def _impscore_fixture(tmp_path, n: int):
    # The upstream all_data.csv layout (a pandas index column, then the four sentences).
    lines = [",pos_implicit,pos_explicit,neg_implicit,neg_explicit"]
    for i in range(n):
        lines.append(
            f'{i},"implicit {i}, a hint",explicit {i},other implicit {i},other explicit {i}'
        )
    path = tmp_path / "all_data.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_impscore_read_and_pairs(tmp_path):
    rows = read_impscore(_impscore_fixture(tmp_path, 3))
    assert len(rows) == 3
    assert rows[2].line == 4
    assert rows[2].pairs() == (
        ("implicit 2, a hint", "explicit 2"),
        ("other implicit 2", "other explicit 2"),
    )
