"""ImpScore's train / valid / test split against a transcription of its own description."""

from __future__ import annotations

import random

import pytest

from data_pipelines.impscore import impscore_split_indices, split_impscore


def impscore_reference(n: int) -> tuple[list[int], list[int], list[int]]:
    """ImpScore's procedure written out as described (docs/dualcse.md, "EIS protocol"):
    ``random.seed(42)`` on the global generator, then ``random.sample`` of int(0.9 N)
    training rows from ``range(N)``, then int(0.05 N) valid rows from
    ``list(set(range(N)) - set(train))``; test = the rows left. The caller's global random
    state is put back afterwards."""
    state = random.getstate()
    try:
        random.seed(42)
        total = n
        train_num = int(total * (1 - 0.05 * 2))
        valid_num = int(total * 0.05)
        train = random.sample(range(total), train_num)
        valid = random.sample(list(set(range(total)) - set(train)), valid_num)
        test = list(set(range(total)) - set(train) - set(valid))
    finally:
        random.setstate(state)
    return train, valid, test


# 100: a small file; 56,290 rows: ImpScore's README (112,580 pairs, two per row); 56,289:
# the row count that gives the DualCSE paper's 101,320 train pairs.
@pytest.mark.parametrize("n", [100, 56_289, 56_290])
def test_split_equals_the_impscore_procedure(n):
    got = impscore_split_indices(n)
    want = impscore_reference(n)
    assert got == want  # same rows, same order
    train, valid, test = got
    assert (len(train), len(valid)) == (int(0.9 * n), int(0.05 * n))
    assert sorted(train + valid + test) == list(range(n))  # a partition


def test_split_sizes_at_the_readme_size():
    train, valid, test = impscore_split_indices(56_290)
    # Pairs (two per row): 101,322 / 5,628 / 5,630; the paper states 101,320 / 5,630 / 5,630.
    assert (2 * len(train), 2 * len(valid), 2 * len(test)) == (101_322, 5_628, 5_630)


def test_valid_rows_come_from_the_unsorted_set_order():
    """Sampling the valid rows from the sorted remainder, or shuffling once, picks other
    rows: the split depends on the set iteration order ImpScore sampled from."""
    n = 56_290
    train, valid, _ = impscore_split_indices(n)
    rng = random.Random(42)
    assert rng.sample(range(n), int(0.9 * n)) == train
    sorted_valid = rng.sample(sorted(set(range(n)) - set(train)), int(0.05 * n))
    assert set(sorted_valid) != set(valid)
    shuffled = list(range(n))
    random.Random(42).shuffle(shuffled)
    assert set(shuffled[:int(0.9 * n)]) != set(train)


def test_split_rows_follow_the_indices_and_leave_the_input_alone():
    rows = [f"row {i}" for i in range(100)]
    before = list(rows)
    train, valid, test = split_impscore(rows)
    idx = impscore_reference(100)
    assert (train, valid, test) == tuple([rows[i] for i in part] for part in idx)
    assert rows == before
    state = random.getstate()
    split_impscore(rows)
    assert random.getstate() == state  # the caller's global generator is not touched
