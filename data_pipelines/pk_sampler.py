"""P x K batch sampling for batch-hard triplet training (Hermans, Beyer, Leibe 2017).

Each batch holds P distinct groups (identities, e.g. SQuAD paragraphs) and K items of each
(e.g. questions about that paragraph), so that every anchor has K - 1 positives and
(P - 1) * K negatives in its batch.
"""

from __future__ import annotations

import numpy as np

SMALL_GROUP_POLICIES = ("replace", "skip")


def pk_sample_batches(
    group_of_item: np.ndarray,
    P: int,
    K: int,
    seed: int,
    epoch: int,
    *,
    small_groups: str = "replace",
) -> list[np.ndarray]:
    """One epoch of P x K batches, deterministic given ``(seed, epoch)``.

    An epoch visits every eligible group exactly once, as in Hermans et al. (2017, sec. 3):
    the groups are put in a random order and cut into consecutive runs of P; from each group
    K of its items are drawn without replacement. The last run with fewer than P groups is
    dropped (its groups come first in another epoch's order with high probability), so every
    batch has exactly ``P * K`` indices. Items of large groups that are not drawn in one
    epoch are drawn in others: an epoch is a pass over groups, not over items.

    Groups with fewer than K items (e.g. a paragraph with one question):
      - ``"replace"`` (default): draw their K items with replacement, so they still appear;
        the duplicates are exact copies, which the triplet loss treats as positives at
        distance 0 (harmless for the hardest-positive max over the other copies).
      - ``"skip"``: leave them out.

    Args:
      group_of_item: ``[n]`` int group id of each item (any integers, not necessarily dense).
      P: groups per batch (>= 1).
      K: items per group (>= 1).
      seed, epoch: the random stream is ``numpy.random.default_rng([seed, epoch])``.
      small_groups: one of :data:`SMALL_GROUP_POLICIES`.

    Returns:
      A list of ``[P * K]`` int64 index arrays into ``group_of_item``; within a batch the K
      items of a group are contiguous (group-major order).

    Raises:
      ValueError: ``group_of_item`` not 1-D integer, P or K < 1, unknown ``small_groups``,
        or fewer than P eligible groups (no batch can be formed).
    """
    groups = np.asarray(group_of_item)
    if groups.ndim != 1 or not np.issubdtype(groups.dtype, np.integer):
        raise ValueError(
            f"group_of_item must be a 1-D integer array, got shape {groups.shape} and dtype "
            f"{groups.dtype}"
        )
    if P < 1 or K < 1:
        raise ValueError(f"P and K must be >= 1, got P={P}, K={K}")
    if small_groups not in SMALL_GROUP_POLICIES:
        raise ValueError(
            f"small_groups must be one of {SMALL_GROUP_POLICIES}, got {small_groups!r}"
        )
    rng = np.random.default_rng([seed, epoch])
    # Stable sort: the members of each group in item order, independent of hashing.
    order = np.argsort(groups, kind="stable")
    ids, starts, counts = np.unique(groups[order], return_index=True, return_counts=True)
    members = [order[s : s + c] for s, c in zip(starts, counts, strict=True)]
    eligible = [i for i, c in enumerate(counts) if c >= K or small_groups == "replace"]
    if len(eligible) < P:
        raise ValueError(
            f"only {len(eligible)} groups are eligible (of {len(ids)}; K={K}, "
            f"small_groups={small_groups!r}) but P={P} groups are needed per batch"
        )
    visit = rng.permutation(np.asarray(eligible))
    batches = []
    for b in range(len(visit) // P):
        parts = []
        for g in visit[b * P : (b + 1) * P]:
            items = members[g]
            parts.append(rng.choice(items, size=K, replace=len(items) < K))
        batches.append(np.concatenate(parts).astype(np.int64))
    return batches
