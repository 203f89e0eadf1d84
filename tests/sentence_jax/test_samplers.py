"""Batches as sentence-transformers' samplers choose them: the batch counts per dataset of its
ProportionalBatchSampler and RoundRobinBatchSampler, no text twice under no_duplicates, every
batch from one dataset, and a resume that continues the same order."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from sentence_jax.samplers import Sampler, no_duplicate_batches

torch = pytest.importorskip("torch")


def _theirs(kind: str, sizes: list[int], batch: int, seed: int = 12) -> collections.Counter:
    """sentence-transformers' multi-dataset sampler over per-dataset batch samplers that drop
    the last partial batch (static shapes): batches per dataset in one epoch."""
    from sentence_transformers.base import sampler as st
    from torch.utils.data import BatchSampler, ConcatDataset, RandomSampler

    datasets = [list(range(n)) for n in sizes]
    children = [BatchSampler(RandomSampler(d), batch, drop_last=True) for d in datasets]
    cls = {"proportional": st.ProportionalBatchSampler,
           "round_robin": st.RoundRobinBatchSampler}[kind]
    sampler = cls(ConcatDataset(datasets), children, generator=torch.Generator(), seed=seed)
    offsets = np.cumsum([0, *sizes])
    counts = collections.Counter()
    for rows in sampler:
        d = int(np.searchsorted(offsets, rows[0], side="right")) - 1
        assert all(offsets[d] <= r < offsets[d + 1] for r in rows)  # one dataset a batch
        counts[d] += 1
    return counts


@pytest.mark.parametrize("kind", ["proportional", "round_robin"])
@pytest.mark.parametrize("sizes", [[100, 37], [16, 64, 40]])
def test_batch_counts_per_dataset_equal_sentence_transformers(kind, sizes):
    ours = Sampler(sizes, 8, seed=3, multi_dataset_batch_sampler=kind)
    epoch = ours.epoch(0)
    offsets = np.cumsum([0, *sizes])
    for d, rows in epoch:
        assert len(rows) == 8 and np.all((offsets[d] <= rows) & (rows < offsets[d + 1]))
    assert collections.Counter(d for d, _ in epoch) == _theirs(kind, sizes, 8)
    if kind == "proportional":  # every row used at most once an epoch
        used = np.concatenate([rows for _, rows in epoch])
        assert len(np.unique(used)) == len(used) == sum(n // 8 * 8 for n in sizes)


def test_a_resume_mid_epoch_continues_the_same_order():
    whole = Sampler([40, 24], 8, seed=5)
    steps = [whole(s).tolist() for s in range(20)]  # 2.5 epochs
    resumed = Sampler([40, 24], 8, seed=5)
    assert [resumed(s).tolist() for s in range(11, 20)] == steps[11:]
    assert steps[:8] != steps[8:16]  # each epoch shuffled anew


def test_no_duplicates_never_puts_a_text_twice_in_a_batch():
    rng = np.random.default_rng(0)
    pool = [f"t{i}" for i in range(30)]  # few texts: many rows share one
    values = [frozenset(rng.choice(pool, 2, replace=False)) for _ in range(200)]
    sampler = Sampler([200], 6, seed=1, batch_sampler="no_duplicates", values=values)
    for step in range(3 * sampler.steps_per_epoch()):
        seen = [t for row in sampler(step) for t in values[row]]
        assert len(seen) == len(set(seen)), step


def test_no_duplicates_defers_a_clashing_row_by_hand():
    values = [frozenset({"a", "b"}), frozenset({"a", "c"}), frozenset({"d", "e"}),
              frozenset({"c", "f"}), frozenset({"g", "h"})]
    batches = no_duplicate_batches(np.arange(5), values, 2)
    # 0 then 1 clashes on "a" (waits), 2 fills; then 1 and 3 clash on "c", 4 fills.
    assert [b.tolist() for b in batches] == [[0, 2], [1, 4]]


def test_a_dataset_smaller_than_a_batch_is_named():
    with pytest.raises(ValueError, match="small.csv has 5 rows, fewer than one global batch "
                       "of 8"):
        Sampler([40, 5], 8, seed=0, names=["big.csv", "small.csv"])


def test_steps_in_any_order_equal_a_fresh_sampler_and_one_epoch_is_kept():
    """A resume asks for a late step first, an evaluation may go back: each step's rows equal
    those a sampler walking the steps in order gives, with one epoch's batches held."""
    kwargs = dict(sizes=[23, 41], batch_size=4, seed=7)
    walked = Sampler(**kwargs)
    expected = [walked(step) for step in range(60)]
    jumping = Sampler(**kwargs)
    for step in (55, 3, 41, 0, 59, 12):
        np.testing.assert_array_equal(jumping(step), expected[step])
        assert jumping._cached[0] == jumping.locate(step)[0]
