"""tf.data input pipeline: deterministic, resumable, per-host slices of global batches.

Step s is batch ``b = s % steps_per_epoch`` of epoch ``e = s // steps_per_epoch``: rows
``perm[b*B:(b+1)*B]`` of ``default_rng([seed, e]).permutation(n)`` (the epoch's remainder is
dropped). Every host pads the global batch alike and keeps its contiguous slice. With
``shards`` the order and padding are :mod:`data_pipelines.shards`' (docs/data.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from data_pipelines import shards as shard_layout
from data_pipelines.table import TokenTable, text_identity_ids
from data_pipelines.tf_import import tf  # one line when TensorFlow is missing; hides GPUs

__all__ = ["TokenTable", "make_batches", "steps_per_epoch", "text_identity_ids"]


def steps_per_epoch(n: int, global_batch_size: int) -> int:
    """Full global batches in one pass over n examples (the remainder is dropped).

    Raises:
      ValueError: ``global_batch_size`` < 1 or > n.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    if global_batch_size > n:
        raise ValueError(f"global_batch_size={global_batch_size} is larger than the data set "
                         f"({n} examples): no full batch can be formed; lower the batch size "
                         "or add data")
    return n // global_batch_size


class _StepBatcher:
    """The host slice of step s, from the in-memory table (thread-safe)."""

    def __init__(self, table: TokenTable, *, global_batch_size: int, seed: int,
                 process_index: int, process_count: int, pad_multiple: int,
                 fixed_length: int | None, groups: Sequence[Sequence[int]],
                 shards: Sequence[np.ndarray] | None = None) -> None:
        self.table, self.groups = table, [list(g) for g in groups]
        self.batch, self.seed = global_batch_size, seed
        self.shards = None if shards is None else [np.asarray(s, np.int64) for s in shards]
        self.order = None
        self.static_lengths = None
        if self.shards is not None:
            self.order = shard_layout.ShardOrder(tuple(len(s) for s in self.shards),
                                                 global_batch_size, seed)
            self.spe = self.order.steps_per_epoch
            self._cache: dict = {}
            if fixed_length is None:
                self.static_lengths = shard_layout.group_lengths(
                    table.lengths.max(axis=0), self.groups, pad_multiple, table.max_len)
        else:
            self.spe = steps_per_epoch(table.num_examples, global_batch_size)
        local = global_batch_size // process_count
        self.lo, self.hi = process_index * local, (process_index + 1) * local
        self.pad_multiple, self.fixed_length = pad_multiple, fixed_length
        self._lock = threading.Lock()
        self._epoch, self._perm = -1, np.empty((0,), np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        with self._lock:
            if epoch != self._epoch:
                rng = np.random.default_rng([self.seed, epoch])
                self._perm, self._epoch = rng.permutation(self.table.num_examples), epoch
            return self._perm

    def global_rows(self, step: int) -> np.ndarray:
        """[B] int64 table rows of the global batch of ``step``."""
        if self.order is not None:
            with self._lock:
                return np.concatenate([rows[self.order.positions(step, k, self._cache)]
                                       for k, rows in enumerate(self.shards)])
        epoch, b = divmod(int(step), self.spe)
        return self.permutation(epoch)[b * self.batch : (b + 1) * self.batch]

    def __call__(self, step: np.int64) -> tuple[np.ndarray, ...]:
        rows, t = self.global_rows(int(step)), self.table
        local = rows[self.lo : self.hi]
        out = []
        for g, fields in enumerate(self.groups):
            if self.fixed_length is not None:
                length = self.fixed_length
            elif self.static_lengths is not None:
                length = self.static_lengths[g]
            else:
                # From the GLOBAL batch, so every host pads to the same length.
                longest = max(int(t.lengths[np.ix_(rows, fields)].max()), 1)
                length = min(shard_layout.round_up(longest, self.pad_multiple), t.max_len)
            lengths = t.lengths[local][:, fields]
            mask = (np.arange(length, dtype=np.int32) < lengths[:, :, None]).astype(np.int32)
            out += [t.input_ids[local][:, fields, :length], mask,
                    t.token_type_ids[local][:, fields, :length]]
        return (*out, t.text_ids[local])


def make_batches(
    table: TokenTable,
    *,
    global_batch_size: int,
    seed: int,
    start_step: int = 0,
    num_steps: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    pad_multiple: int = 16,
    fixed_length: int | None = None,
    prefetch: int = 2,
    length_groups: Sequence[Sequence[int]] | None = None,
    shards: Sequence[np.ndarray] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yields this host's slice of each global batch, from ``start_step`` on.

    Args:
      global_batch_size: B, examples per step over all hosts.
      num_steps: None = no end.
      process_index, process_count: host p of P gets rows ``[p*B/P, (p+1)*B/P)``.
      pad_multiple: a step pads to its global batch's longest sequence rounded up to this
        (capped at ``max_len``); ``fixed_length`` pads to exactly that instead.
      length_groups: a partition of the fields padded separately; group g is yielded as
        ``input_ids_g``, ``attention_mask_g``, ``token_type_ids_g`` [B/P, F_g, L_g].
      shards: table rows of each shard (``Manifest.members()``).

    Yields:
      ``input_ids``, ``attention_mask`` (1 on real tokens), ``token_type_ids`` [B/P, F, L]
      int32, ``text_ids`` [B/P, F] int32 and ``step`` (int64).

    Raises:
      ValueError: B not divisible by P or larger than the table, a bad process_index,
        length_groups, start_step, num_steps, pad_multiple or fixed_length; shards that do not
        partition the rows or cannot fill B/S rows each.
    """
    n = table.num_examples
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must lie in [0, {process_count})")
    if global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"process_count={process_count}")
    if shards is None:
        steps_per_epoch(n, global_batch_size)  # raises on B > n
    elif not np.array_equal(np.sort(np.concatenate([np.asarray(s) for s in shards])), np.arange(n)):
        raise ValueError(f"shards must partition the table's {n} rows")
    check_steps(start_step, num_steps, pad_multiple, fixed_length,
                int(table.lengths.max(initial=0)), table.max_len,
                "the longest sequence of the table")
    num_fields = len(table.field_names)
    groups = field_groups(num_fields, length_groups)
    batcher = _StepBatcher(table, global_batch_size=global_batch_size, seed=seed,
                           process_index=process_index, process_count=process_count,
                           pad_multiple=pad_multiple, fixed_length=fixed_length,
                           groups=groups, shards=shards)
    return step_batches(batcher, groups=groups, lengths=[fixed_length] * len(groups),
                        local_batch=global_batch_size // process_count, num_fields=num_fields,
                        grouped=length_groups is not None, start_step=start_step,
                        num_steps=num_steps, prefetch=prefetch)


def check_steps(start_step: int, num_steps: int | None, pad_multiple: int,
                fixed_length: int | None, longest: int, max_len: int, what: str) -> None:
    """Raises ValueError for a negative start_step or num_steps, pad_multiple < 1, or a
    fixed_length outside [longest, max_len]."""
    if start_step < 0 or (num_steps is not None and num_steps < 0):
        raise ValueError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be positive, got {pad_multiple}")
    if fixed_length is not None and not longest <= fixed_length <= max_len:
        raise ValueError(f"fixed_length={fixed_length} must lie in [{longest}, {max_len}]: "
                         f"{what} and the stored width")


def field_groups(num_fields: int, length_groups: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """The length groups as lists of field indices (default: one group of all).

    Raises:
      ValueError: not a partition of ``0..num_fields-1`` into non-empty groups.
    """
    groups = [list(range(num_fields))] if length_groups is None else [list(g) for g in
                                                                        length_groups]
    if sorted(i for g in groups for i in g) != list(range(num_fields)) or not all(groups):
        raise ValueError(f"length_groups={length_groups} must partition the field indices "
                         f"0..{num_fields - 1}")
    return groups


def step_batches(
    batcher, *, groups: Sequence[Sequence[int]], lengths: Sequence[int | None],
    local_batch: int, num_fields: int, grouped: bool, start_step: int,
    num_steps: int | None, prefetch: int,
) -> Iterator[dict[str, np.ndarray]]:
    """The tf.data loop of the in-memory and the streamed paths.

    ``batcher(step)`` returns per group ``input_ids``, ``attention_mask``, ``token_type_ids``
    int32 [local_batch, F_g, L_g], then ``text_ids`` [local_batch, F]; ``lengths[g]`` fixes L_g
    (None: varies). An exception of ``batcher`` is re-raised as itself, not TensorFlow's wrapper.
    """
    names = ("input_ids", "attention_mask", "token_type_ids")

    # tf.data wraps an exception of the batcher in a many-line TensorFlow error; keep the
    # original (e.g. a DataError naming a damaged shard) and raise it instead.
    failures: list[Exception] = []

    def guarded(step: np.int64) -> tuple[np.ndarray, ...]:
        try:
            return batcher(step)
        except Exception as err:
            failures.append(err)
            raise

    def gather(step: tf.Tensor) -> dict[str, tf.Tensor]:
        arrays = tf.numpy_function(guarded, [step], [tf.int32] * (3 * len(groups) + 1),
                                   stateful=False)
        out = {"text_ids": arrays[-1], "step": step}
        out["text_ids"].set_shape([local_batch, num_fields])
        for g, (fields, length) in enumerate(zip(groups, lengths, strict=True)):
            for k, name in enumerate(names):
                array = arrays[3 * g + k]
                array.set_shape([local_batch, len(fields), length])
                out[f"{name}_{g}" if grouped else name] = array
        return out

    if num_steps is None:
        steps = tf.data.Dataset.counter(start=start_step, dtype=tf.int64)
    else:
        steps = tf.data.Dataset.range(start_step, start_step + num_steps, dtype=tf.int64)
    options = tf.data.Options()
    options.deterministic = True
    dataset = steps.map(gather).prefetch(prefetch).with_options(options)
    numpy_batches = dataset.as_numpy_iterator()

    def batches() -> Iterator[dict[str, np.ndarray]]:
        try:
            yield from numpy_batches
        except tf.errors.OpError:
            if failures:
                raise failures[0] from None
            raise

    return batches()
