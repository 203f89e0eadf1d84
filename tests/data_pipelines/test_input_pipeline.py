"""tf.data batches: the order is a function of (seed, step), exact across hosts and resumption."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.pipeline import TokenTable, make_batches, steps_per_epoch, text_identity_ids

N, F, MAX_LEN = 37, 2, 40


@pytest.fixture(scope="module")
def table() -> TokenTable:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 25, size=(N, F)).astype(np.int32)
    lengths[5, 1] = MAX_LEN  # one full-width sequence, so the cap at max_len is reached
    input_ids = rng.integers(1000, 2000, size=(N, F, MAX_LEN)).astype(np.int32)
    input_ids[:, :, 0] = np.arange(N)[:, None]  # the row index, to identify rows in batches
    positions = np.arange(MAX_LEN)
    input_ids[positions >= lengths[:, :, None]] = 0
    token_type_ids = (positions >= lengths[:, :, None] // 2).astype(np.int32)
    text_ids = np.stack([np.arange(N), np.arange(N) + N], axis=1)
    return TokenTable(input_ids, token_type_ids, lengths, text_ids, ("a", "b"))


def _run(table, **kw) -> list[dict[str, np.ndarray]]:
    return list(make_batches(table, **kw))


def _rows(batch) -> list[int]:
    return batch["input_ids"][:, 0, 0].tolist()


def test_order_and_padding_follow_the_definition(table):
    batch_size, pad = 8, 16
    spe = steps_per_epoch(N, batch_size)
    assert spe == 4
    batches = _run(table, global_batch_size=batch_size, seed=7, num_steps=9, pad_multiple=pad)
    assert [int(b["step"]) for b in batches] == list(range(9))
    for step, batch in enumerate(batches):
        epoch, b = divmod(step, spe)
        perm = np.random.default_rng([7, epoch]).permutation(N)
        rows = perm[b * batch_size : (b + 1) * batch_size]
        assert _rows(batch) == rows.tolist()
        longest = table.lengths[rows].max()
        length = batch["input_ids"].shape[-1]
        assert length == min(-(-longest // pad) * pad, MAX_LEN)
        assert length >= longest and (length % pad == 0 or length == MAX_LEN)
        np.testing.assert_array_equal(batch["input_ids"], table.input_ids[rows, :, :length])
        np.testing.assert_array_equal(
            batch["token_type_ids"], table.token_type_ids[rows, :, :length]
        )
        np.testing.assert_array_equal(batch["attention_mask"].sum(-1), table.lengths[rows])
        assert batch["attention_mask"].dtype == np.int32
        np.testing.assert_array_equal(batch["text_ids"], table.text_ids[rows])
    # Some step's global batch reaches the 40-token cap and some does not, with pad 16.
    lengths = {b["input_ids"].shape[-1] for b in batches}
    assert MAX_LEN in lengths and lengths & {16, 32}


def test_epoch_covers_each_example_once(table):
    sub = TokenTable(
        table.input_ids[:32], table.token_type_ids[:32], table.lengths[:32],
        table.text_ids[:32], table.field_names,
    )
    batches = _run(sub, global_batch_size=8, seed=3, num_steps=8)
    for epoch in range(2):
        rows = sum((_rows(b) for b in batches[4 * epoch : 4 * epoch + 4]), [])
        assert sorted(rows) == list(range(32))
    assert sum((_rows(b) for b in batches[:4]), []) != sum((_rows(b) for b in batches[4:]), [])


def test_hosts_slices_make_the_global_batch(table):
    kw = dict(global_batch_size=8, seed=11, num_steps=6, pad_multiple=8)
    whole = _run(table, **kw)
    hosts = [_run(table, process_index=p, process_count=2, **kw) for p in range(2)]
    for step, batch in enumerate(whole):
        for key in ("input_ids", "attention_mask", "token_type_ids", "text_ids"):
            parts = [hosts[p][step][key] for p in range(2)]
            assert parts[0].shape[0] == 4
            np.testing.assert_array_equal(np.concatenate(parts), batch[key])


def test_resume_equals_uninterrupted_tail(table):
    kw = dict(global_batch_size=8, seed=5, pad_multiple=8)
    full = _run(table, num_steps=11, **kw)
    resumed = _run(table, start_step=6, num_steps=5, **kw)
    assert [int(b["step"]) for b in resumed] == list(range(6, 11))
    for a, b in zip(full[6:], resumed, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_deterministic_and_seed_dependent(table):
    kw = dict(global_batch_size=8, num_steps=3)
    first, again = _run(table, seed=1, **kw), _run(table, seed=1, **kw)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    assert _rows(first[0]) != _rows(_run(table, seed=2, **kw)[0])


def test_endless_iterator_and_fixed_length(table):
    it = make_batches(table, global_batch_size=4, seed=0, fixed_length=MAX_LEN, prefetch=1)
    shapes = [next(it)["input_ids"].shape for _ in range(12)]  # past the first epoch (9)
    assert set(shapes) == {(4, F, MAX_LEN)}


def test_bad_arguments(table):
    with pytest.raises(ValueError, match="divisible"):
        make_batches(table, global_batch_size=9, seed=0, process_count=2)
    with pytest.raises(ValueError, match="larger than the data set"):
        make_batches(table, global_batch_size=38, seed=0)
    with pytest.raises(ValueError, match="fixed_length"):
        make_batches(table, global_batch_size=8, seed=0, fixed_length=MAX_LEN - 1)
    with pytest.raises(ValueError, match="process_index"):
        make_batches(table, global_batch_size=8, seed=0, process_index=2, process_count=2)


def test_text_identity_ids():
    texts = ["A  b", " a b\n", "A\tB", "ab", "a b c", "AB"]
    assert text_identity_ids(texts).tolist() == [0, 0, 0, 1, 2, 1]
    assert text_identity_ids(texts).dtype == np.int32


def test_length_groups_pad_each_group_to_its_own_longest(table):
    plain = _run(table, global_batch_size=8, seed=3, num_steps=4, pad_multiple=8)
    grouped = _run(table, global_batch_size=8, seed=3, num_steps=4, pad_multiple=8,
                   length_groups=((0,), (1,)))
    for p, g in zip(plain, grouped, strict=True):
        rows = _rows(p)
        for k, field in enumerate((0, 1)):
            longest = table.lengths[rows, field].max()
            length = g[f"input_ids_{k}"].shape[-1]
            assert length == min(-(-longest // 8) * 8, MAX_LEN)
            np.testing.assert_array_equal(g[f"input_ids_{k}"][:, 0],
                                          p["input_ids"][:, field, :length])
            np.testing.assert_array_equal(g[f"attention_mask_{k}"].sum(-1)[:, 0],
                                          table.lengths[rows, field])
        np.testing.assert_array_equal(g["text_ids"], p["text_ids"])
    with pytest.raises(ValueError, match="partition"):
        make_batches(table, global_batch_size=8, seed=0, length_groups=((0,), (0, 1)))
