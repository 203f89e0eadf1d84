"""tf.data input pipeline: deterministic, resumable, per-host slices of global batches.

The order is a pure function of (seed, step): step s is in epoch ``e = s // steps_per_epoch``,
epoch e visits the rows in the order ``np.random.default_rng([seed, e]).permutation(n)``, and
the global batch of step s is rows ``perm[b*B:(b+1)*B]`` with ``b = s % steps_per_epoch`` (the
remainder of each epoch is dropped). Every host computes the same permutation and the same
padded length, then keeps only its contiguous slice of the global batch, so the hosts'
slices put side by side are the global batch, and restarting at step k (the saved data
position) continues exactly as an uninterrupted run.

The token table stays in host memory as numpy; tf.data only gathers the rows of each step
(no shuffle buffer), pads to the step's length and prefetches. TensorFlow is kept off every
accelerator.

With ``shards`` (the table rows of each shard of a sharded corpus), the order and padding
are instead those of :mod:`data_pipelines.shards`, so that the in-memory table gives the
very batches that ``data_pipelines.sharded_corpus.make_batches`` streams from the shard
files (docs/data.md, "Sharded corpora").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow as tf

from data_pipelines import shards as shard_layout
from data_pipelines.table import TokenTable, text_identity_ids

try:
    # TensorFlow must never take the GPU/TPU memory that JAX needs.
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):
    pass  # devices already initialised by an earlier import; nothing more can be done here

__all__ = ["TokenTable", "make_batches", "steps_per_epoch", "text_identity_ids"]


def steps_per_epoch(n: int, global_batch_size: int) -> int:
    """Full global batches in one pass over n examples (the remainder is dropped).

    Raises:
      ValueError: ``global_batch_size`` < 1 or > n.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    if global_batch_size > n:
        raise ValueError(
            f"global_batch_size={global_batch_size} is larger than the data set ({n} examples): "
            "no full batch can be formed; lower the batch size or add data"
        )
    return n // global_batch_size


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class _StepBatcher:
    """Numpy side of the pipeline: the host slice of step s (thread-safe)."""

    def __init__(
        self,
        table: TokenTable,
        *,
        global_batch_size: int,
        seed: int,
        process_index: int,
        process_count: int,
        pad_multiple: int,
        fixed_length: int | None,
        groups: Sequence[Sequence[int]],
        shards: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.table = table
        self.groups = [list(g) for g in groups]
        self.batch = global_batch_size
        self.seed = seed
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
        self.pad_multiple = pad_multiple
        self.fixed_length = fixed_length
        self._lock = threading.Lock()
        self._epoch = -1
        self._perm = np.empty((0,), np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        with self._lock:
            if epoch != self._epoch:
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(
                    self.table.num_examples
                )
                self._epoch = epoch
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
        rows = self.global_rows(int(step))
        t = self.table
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
                length = min(_round_up(longest, self.pad_multiple), t.max_len)
            input_ids = t.input_ids[local][:, fields, :length]
            token_type_ids = t.token_type_ids[local][:, fields, :length]
            lengths = t.lengths[local][:, fields]
            mask = (np.arange(length, dtype=np.int32) < lengths[:, :, None]).astype(np.int32)
            out += [input_ids, mask, token_type_ids]
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
      table: the examples; see :class:`TokenTable`.
      global_batch_size: B, examples per step summed over all hosts.
      seed: the order's seed; epoch e's order is ``default_rng([seed, e]).permutation(n)``.
      start_step: the first step to yield (the resumable data position).
      num_steps: how many steps to yield; None for no end (epochs repeat with new orders).
      process_index, process_count: this host p and the number of hosts P; host p gets rows
        ``[p*B/P, (p+1)*B/P)`` of each global batch.
      pad_multiple: the padded length L of a step is the longest sequence of the global
        batch (all rows, all fields) rounded up to this multiple, capped at the table's
        max_len; fewer distinct shapes means fewer XLA recompilations.
      fixed_length: if given, every step is padded to exactly this length instead.
      prefetch: batches prepared ahead in the background.
      length_groups: optional partition of the field indices into groups padded
        separately (e.g. long premises and short hypotheses), so short fields do not pay
        for the longest one. Group g's arrays are yielded under ``"input_ids_g"``,
        ``"attention_mask_g"`` and ``"token_type_ids_g"`` with shape [B/P, F_g, L_g];
        ``text_ids`` stays [B/P, F].
      shards: optional table rows of each shard of a sharded corpus, in record order
        (``shards.Manifest.members()``); the global batches and the padding are then those
        of :mod:`data_pipelines.shards` (every group padded to the table's longest
        sequence of its fields, rounded up to ``pad_multiple``), the batches that
        ``sharded_corpus.make_batches`` streams from the corpus's files.

    Yields:
      dicts with ``"input_ids"`` [B/P, F, L] int32, ``"attention_mask"`` [B/P, F, L] int32
      (1 on real tokens), ``"token_type_ids"`` [B/P, F, L] int32, ``"text_ids"`` [B/P, F] int32
      and ``"step"`` (int64 scalar, the global step of the batch).

    Raises:
      ValueError: B not divisible by P, B larger than the table, process_index out of range,
        length_groups that are not a partition of the fields,
        start_step or num_steps negative, pad_multiple < 1, or fixed_length shorter than a
        sequence of the table or longer than its max_len; with ``shards``: shards that do
        not partition the rows, B not a multiple of their number, or a shard with fewer
        than B/S rows.
    """
    n = table.num_examples
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must lie in [0, {process_count})")
    if global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by "
            f"process_count={process_count}"
        )
    if shards is None:
        steps_per_epoch(n, global_batch_size)  # raises on B > n
    elif not np.array_equal(np.sort(np.concatenate([np.asarray(s) for s in shards])),
                            np.arange(n)):
        raise ValueError(f"shards must partition the table's {n} rows")
    if start_step < 0 or (num_steps is not None and num_steps < 0):
        raise ValueError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be positive, got {pad_multiple}")
    if fixed_length is not None:
        longest = int(table.lengths.max())
        if not longest <= fixed_length <= table.max_len:
            raise ValueError(
                f"fixed_length={fixed_length} must lie in [{longest}, {table.max_len}]: the "
                "longest sequence of the table and the stored width"
            )

    num_fields = len(table.field_names)
    groups = field_groups(num_fields, length_groups)
    batcher = _StepBatcher(
        table,
        global_batch_size=global_batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        pad_multiple=pad_multiple,
        fixed_length=fixed_length,
        groups=groups,
        shards=shards,
    )
    return step_batches(batcher, groups=groups, lengths=[fixed_length] * len(groups),
                        local_batch=global_batch_size // process_count, num_fields=num_fields,
                        grouped=length_groups is not None, start_step=start_step,
                        num_steps=num_steps, prefetch=prefetch)


def field_groups(num_fields: int, length_groups: Sequence[Sequence[int]] | None
                 ) -> list[list[int]]:
    """The length groups as lists of field indices (one group of all fields by default).

    Raises:
      ValueError: ``length_groups`` is not a partition of ``0..num_fields-1`` into
        non-empty groups.
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
    """The tf.data loop shared by the in-memory and the streamed paths.

    ``batcher(step)`` (numpy, thread-safe) returns, for each group g, ``input_ids``,
    ``attention_mask`` and ``token_type_ids`` int32 [local_batch, F_g, L_g], then
    ``text_ids`` int32 [local_batch, F]. Steps run from ``start_step`` (``num_steps`` of
    them, or without end) in a deterministic order with ``prefetch`` batches ahead.
    ``lengths[g]`` fixes L_g in the static shape (None: it varies by step).

    Yields:
      The arrays by name (``name_g`` when ``grouped``), ``text_ids`` and ``step`` (int64).

    Raises:
      Exception: the exception ``batcher`` raised (not TensorFlow's wrapper of it).
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
