"""The rows of each step's global batch, as sentence-transformers' batch samplers choose them:
``batch_sampler`` ``batch_sampler`` | ``no_duplicates``, ``multi_dataset_batch_sampler``
``proportional`` | ``round_robin``; every batch full (static shapes) and from one dataset;
a function of (seed, step) only, so a resume continues the same order (``docs/sentence.md``,
"Batches")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCH_SAMPLERS = ("batch_sampler", "no_duplicates")
MULTI_DATASET_SAMPLERS = ("proportional", "round_robin")


def no_duplicate_batches(order: np.ndarray, values: Sequence[frozenset[str]],
                         batch_size: int) -> list[np.ndarray]:
    """Full batches of ``order`` in which no text appears twice: a row whose texts meet the
    batch's waits for a later batch (sentence-transformers' ``NoDuplicatesBatchSampler``);
    the rows that fill no batch are left for the next epoch's shuffle."""
    waiting = [int(i) for i in order]
    batches = []
    while len(waiting) >= batch_size:
        batch, seen, rest = [], set(), []
        for k, row in enumerate(waiting):
            if len(batch) == batch_size:
                rest.extend(waiting[k:])
                break
            if values[row] & seen:
                rest.append(row)
                continue
            batch.append(row)
            seen |= values[row]
        if len(batch) < batch_size:
            break
        batches.append(np.asarray(batch, np.int64))
        waiting = rest
    return batches


class Sampler:
    """``sampler(step)``: ``[B]`` int64 rows (datasets concatenated in order) of that step.

    Each epoch each dataset is shuffled by ``default_rng([seed, epoch, d])`` and cut into full
    batches; ``proportional`` draws the batches' order by ``default_rng([seed, epoch])`` (each
    dataset's batches all used), ``round_robin`` takes one batch from each in turn until the
    smallest runs out. Raises ValueError: a dataset smaller than a batch, unknown names."""

    def __init__(self, sizes: Sequence[int], batch_size: int, seed: int, *,
                 batch_sampler: str = "batch_sampler",
                 multi_dataset_batch_sampler: str = "proportional",
                 values: Sequence[frozenset[str]] | None = None,
                 names: Sequence[str] | None = None) -> None:
        if batch_sampler not in BATCH_SAMPLERS:
            raise ValueError(f"batch_sampler={batch_sampler!r}: one of {BATCH_SAMPLERS}")
        if multi_dataset_batch_sampler not in MULTI_DATASET_SAMPLERS:
            raise ValueError(f"multi_dataset_batch_sampler={multi_dataset_batch_sampler!r}: "
                             f"one of {MULTI_DATASET_SAMPLERS}")
        if batch_sampler == "no_duplicates" and values is None:
            raise ValueError("no_duplicates needs each row's texts")
        names = list(names or [f"dataset {d}" for d in range(len(sizes))])
        for name, size in zip(names, sizes, strict=True):
            if size < batch_size:
                raise ValueError(f"{name} has {size} rows, fewer than one global batch of "
                                 f"{batch_size}")
        self.sizes, self.batch_size, self.seed = [int(s) for s in sizes], int(batch_size), seed
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.no_duplicates = batch_sampler == "no_duplicates"
        self.round_robin = multi_dataset_batch_sampler == "round_robin"
        self.values = values
        self._starts = [0]  # first step of each epoch counted so far
        # One epoch's batches kept (not every epoch's: a long run would hold a row index per
        # row and epoch); an epoch is a function of (seed, epoch), so it is recomputed.
        self._cached: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def _dataset_batches(self, epoch: int, d: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.seed, epoch, d]).permutation(self.sizes[d])
        rows = order + self.offsets[d]
        if self.no_duplicates:
            return no_duplicate_batches(rows, self.values, self.batch_size)
        full = len(rows) // self.batch_size * self.batch_size
        return list(rows[:full].reshape(-1, self.batch_size))

    def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """``(dataset, [B] rows)`` of every batch of ``epoch``, in step order."""
        per = [self._dataset_batches(epoch, d) for d in range(len(self.sizes))]
        if self.round_robin:
            count = min(len(b) for b in per)
            return [(d, per[d][k]) for k in range(count) for d in range(len(per))]
        labels = np.concatenate([np.full(len(b), d) for d, b in enumerate(per)])
        order = np.random.default_rng([self.seed, epoch]).permutation(labels)
        taken = [0] * len(per)
        out = []
        for d in order:
            out.append((int(d), per[d][taken[d]]))
            taken[d] += 1
        return out

    def locate(self, step: int) -> tuple[int, int]:
        """``(epoch, batch index in it)`` of ``step``."""
        while self._starts[-1] <= step:
            batches = self._batches(len(self._starts) - 1)
            if not batches:
                raise ValueError("no_duplicates found no full batch: too few distinct texts "
                                 f"for a global batch of {self.batch_size}")
            self._starts.append(self._starts[-1] + len(batches))
        epoch = int(np.searchsorted(self._starts, step, side="right")) - 1
        return epoch, step - self._starts[epoch]

    def steps_per_epoch(self) -> int:
        """Batches in epoch 0 (later epochs may differ by a few under ``no_duplicates``)."""
        self.locate(0)
        return self._starts[1]

    def _batches(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self.epoch(epoch))
        return self._cached[1]

    def __call__(self, step: int) -> np.ndarray:
        epoch, k = self.locate(step)
        return self._batches(epoch)[k][1]
