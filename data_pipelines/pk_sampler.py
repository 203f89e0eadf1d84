"""P x K batches for batch-hard triplet training (Hermans, Beyer, Leibe 2017)."""

from __future__ import annotations

import numpy as np

SMALL_GROUP_POLICIES = ("replace", "skip")


def pk_sample_batches(group_of_item: np.ndarray, P: int, K: int, seed: int, epoch: int, *,
                      small_groups: str = "replace") -> list[np.ndarray]:
    """One epoch of ``[P * K]`` int64 batches from ``default_rng([seed, epoch])`` (runs of P
    shuffled groups, K items each; ``small_groups``: replace or skip); ValueError."""
    groups = np.asarray(group_of_item)
    if groups.ndim != 1 or not np.issubdtype(groups.dtype, np.integer):
        raise ValueError(f"group_of_item must be a 1-D integer array, got shape "
                         f"{groups.shape} and dtype {groups.dtype}")
    if P < 1 or K < 1:
        raise ValueError(f"P and K must be >= 1, got P={P}, K={K}")
    if small_groups not in SMALL_GROUP_POLICIES:
        raise ValueError(f"small_groups must be one of {SMALL_GROUP_POLICIES}, got "
                         f"{small_groups!r}")
    rng = np.random.default_rng([seed, epoch])
    # Stable sort: the members of each group in item order, independent of hashing.
    order = np.argsort(groups, kind="stable")
    ids, starts, counts = np.unique(groups[order], return_index=True, return_counts=True)
    members = [order[s : s + c] for s, c in zip(starts, counts, strict=True)]
    eligible = [i for i, c in enumerate(counts) if c >= K or small_groups == "replace"]
    if len(eligible) < P:
        raise ValueError(f"only {len(eligible)} groups are eligible (of {len(ids)}; K={K}, "
                         f"small_groups={small_groups!r}) but P={P} groups are needed per batch")
    visit = rng.permutation(np.asarray(eligible))
    return [np.concatenate([rng.choice(members[g], size=K, replace=len(members[g]) < K)
                            for g in visit[b * P : (b + 1) * P]]).astype(np.int64)
            for b in range(len(visit) // P)]
