"""tf.data input pipeline: deterministic, resumable, per-host slices of global batches, from a
table in memory or a sharded corpus (docs/data.md, "In-memory batches", "Sharded corpora")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from data_pipelines import shards as shard_layout
from data_pipelines.table import TokenTable, text_identity_ids
from data_pipelines.tf_import import tf  # one line when TensorFlow is missing; hides GPUs

__all__ = ["TokenTable", "make_batches", "steps_per_epoch", "text_identity_ids"]


def steps_per_epoch(n: int, global_batch_size: int) -> int:
    """Full global batches in one pass over n examples; ValueError: B < 1 or B > n."""
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
                 shards: Sequence[np.ndarray] | None = None,
                 order: Callable[[int], np.ndarray] | None = None,
                 row_values: Mapping[str, np.ndarray] | None = None) -> None:
        self.table, self.groups = table, [list(g) for g in groups]
        self.custom_order, self.row_values = order, dict(row_values or {})
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
        if self.custom_order is not None:
            return np.asarray(self.custom_order(int(step)), np.int64)
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
        return (*out, t.text_ids[local], *(v[local] for v in self.row_values.values()))


def make_batches(
    source: TokenTable | shard_layout.Manifest,
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
    order: Callable[[int], np.ndarray] | None = None,
    row_values: Mapping[str, np.ndarray] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """This host's slice of each global batch from ``start_step`` (``num_steps`` None: no end),
    from a table or streamed from a sharded corpus's own shards: ``input_ids``, ``attention_mask``,
    ``token_type_ids`` [B/P, F, L] int32 (``*_g`` [B/P, F_g, L_g] per ``length_groups``),
    ``text_ids`` [B/P, F] int32, ``step`` int64. Host p of P gets rows ``[p*B/P, (p+1)*B/P)`` (a
    corpus: B a multiple of its S shards, ``S % P == 0``); a step pads to its global batch's longest
    sequence (a corpus: its longest) rounded up to ``pad_multiple``, or to ``fixed_length``;
    ``shards``: a table's rows per shard (``Manifest.members()``), the corpus order. ValueError:
    inconsistent B, P, S, rows, steps, padding or groups; DataError: a shard file missing or damaged
    (named). A table only: ``order(step)`` the [B] rows of a step (a sampler) in place of the
    epoch permutation; ``row_values`` ``{name: [n, ...]}`` arrays batched beside the tokens."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must lie in [0, {process_count})")
    if global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"process_count={process_count}")
    streamed = isinstance(source, shard_layout.Manifest)
    if streamed and (order is not None or row_values):
        raise ValueError("order and row_values batch an in-memory table, not a sharded corpus")
    if streamed:
        owned = shard_layout.host_shards(source.num_shards, process_index, process_count)
        order = source.order(global_batch_size, seed)
        fields, longest, max_len = source.fields, max(source.longest), source.max_length
        what = "the corpus's longest sequence"
    else:
        n = source.num_examples
        if shards is None:
            steps_per_epoch(n, global_batch_size)  # raises on B > n
        elif not np.array_equal(np.sort(np.concatenate([np.asarray(s) for s in shards])),
                                np.arange(n)):
            raise ValueError(f"shards must partition the table's {n} rows")
        fields, max_len = source.field_names, source.max_len
        longest, what = int(source.lengths.max(initial=0)), "the longest sequence of the table"
    check_steps(start_step, num_steps, pad_multiple, fixed_length, longest, max_len, what)
    groups = field_groups(len(fields), length_groups)
    lengths = [fixed_length] * len(groups)
    if streamed:
        if fixed_length is None:
            lengths = shard_layout.group_lengths(source.longest, groups, pad_multiple, max_len)
        batcher = shard_layout.StreamBatcher(source, order, owned, groups, lengths)
    else:
        batcher = _StepBatcher(source, global_batch_size=global_batch_size, seed=seed,
                               process_index=process_index, process_count=process_count,
                               pad_multiple=pad_multiple, fixed_length=fixed_length,
                               groups=groups, shards=shards, order=order,
                               row_values=row_values)
    values = {k: np.asarray(v) for k, v in (row_values or {}).items()}
    return step_batches(batcher, groups=groups, lengths=lengths,
                        local_batch=global_batch_size // process_count, num_fields=len(fields),
                        grouped=length_groups is not None, start_step=start_step,
                        num_steps=num_steps, prefetch=prefetch,
                        values={k: (v.dtype, v.shape[1:]) for k, v in values.items()})


def check_steps(start_step: int, num_steps: int | None, pad_multiple: int,
                fixed_length: int | None, longest: int, max_len: int, what: str) -> None:
    """ValueError for a negative start_step or num_steps, pad_multiple < 1, or a fixed_length
    outside [longest, max_len]."""
    if start_step < 0 or (num_steps is not None and num_steps < 0):
        raise ValueError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be positive, got {pad_multiple}")
    if fixed_length is not None and not longest <= fixed_length <= max_len:
        raise ValueError(f"fixed_length={fixed_length} must lie in [{longest}, {max_len}]: "
                         f"{what} and the stored width")


def field_groups(num_fields: int, length_groups: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """The length groups as lists of field indices (default: one group of all); ValueError: not a
    partition of ``0..num_fields-1`` into non-empty groups."""
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
    values: Mapping[str, tuple[np.dtype, tuple[int, ...]]] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The tf.data loop over ``batcher(step)`` (per group ids, mask, types, ``text_ids``, then
    ``values`` by name: ``(dtype, row shape)``);
    ``lengths[g]`` fixes L_g; the batcher's exception re-raised as itself."""
    names = ("input_ids", "attention_mask", "token_type_ids")
    failures: list[Exception] = []  # not tf.data's many-line wrapper: the batcher's own error

    def guarded(step: np.int64) -> tuple[np.ndarray, ...]:
        try:
            return batcher(step)
        except Exception as err:
            failures.append(err)
            raise

    def gather(step: tf.Tensor) -> dict[str, tf.Tensor]:
        extra = dict(values or {})
        arrays = tf.numpy_function(
            guarded, [step], [tf.int32] * (3 * len(groups) + 1)
            + [tf.as_dtype(dtype) for dtype, _ in extra.values()], stateful=False)
        base = 3 * len(groups)
        out = {"text_ids": arrays[base], "step": step}
        out["text_ids"].set_shape([local_batch, num_fields])
        for i, (name, (_, shape)) in enumerate(extra.items()):
            out[name] = arrays[base + 1 + i]
            out[name].set_shape([local_batch, *shape])
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
