"""P x K sampler: batch structure, small-group policies, determinism."""

import numpy as np
import pytest

from data_pipelines.pk_sampler import pk_sample_batches

# Group 5 has 1 item, group 9 has 2, groups 1, 2, 3 have 4, 3, 5 items.
GROUPS = np.array([1, 1, 2, 9, 3, 3, 1, 2, 5, 3, 9, 3, 1, 2, 3])


@pytest.mark.parametrize("policy", ["replace", "skip"])
def test_batches_have_p_distinct_groups_of_k(policy):
    P, K = 2, 3
    batches = pk_sample_batches(GROUPS, P, K, seed=0, epoch=0, small_groups=policy)
    eligible = 5 if policy == "replace" else 3
    assert len(batches) == eligible // P
    seen = []
    for batch in batches:
        assert batch.shape == (P * K,)
        per_group = GROUPS[batch].reshape(P, K)
        assert np.all(per_group == per_group[:, :1])  # K items of one group, contiguous
        assert len(set(per_group[:, 0])) == P  # P distinct groups
        seen += list(per_group[:, 0])
        for row, idx in zip(per_group, batch.reshape(P, K), strict=True):
            if (GROUPS == row[0]).sum() >= K:
                assert len(set(idx)) == K  # large groups: no repeated item
    if policy == "skip":
        assert not {5, 9} & set(seen)
    assert len(seen) == len(set(seen))  # each group at most once per epoch


def test_small_groups_drawn_with_replacement():
    batches = pk_sample_batches(GROUPS, 5, 3, seed=1, epoch=0)
    (batch,) = batches
    idx = batch.reshape(5, 3)
    row = [r for r in idx if GROUPS[r[0]] == 5][0]
    assert list(row) == [8, 8, 8]


def test_deterministic_by_seed_and_epoch():
    a = pk_sample_batches(GROUPS, 2, 2, seed=3, epoch=4)
    b = pk_sample_batches(GROUPS, 2, 2, seed=3, epoch=4)
    c = pk_sample_batches(GROUPS, 2, 2, seed=3, epoch=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_errors():
    with pytest.raises(ValueError, match="eligible"):
        pk_sample_batches(GROUPS, 4, 4, seed=0, epoch=0, small_groups="skip")
    with pytest.raises(ValueError, match="integer"):
        pk_sample_batches(GROUPS.astype(float), 2, 2, seed=0, epoch=0)
