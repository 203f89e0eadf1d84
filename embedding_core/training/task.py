"""The Task seam: what a model package tells ``run`` (``docs/architecture.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from embedding_core.losses.contrastive import GradAccumulation
from embedding_core.losses.table_update import FusedTableUpdate


@dataclasses.dataclass(frozen=True)
class BatchField:
    """A batch field: ``kind`` ``"int"``, ``"float"`` or ``"bool"``; ``shape``: names (equal
    wherever the same name appears) or fixed ints."""

    kind: str
    shape: tuple[str | int, ...]


BatchSpec = Mapping[str, BatchField]
_KINDS = {"int": "iu", "float": "f", "bool": "b"}


def check_batch(spec: BatchSpec, batch: Mapping[str, np.ndarray], what: str) -> None:
    """Raises ValueError naming ``what`` and the first field that breaks ``spec``."""
    extra = sorted(set(batch) - set(spec) - {"step"})
    missing = sorted(set(spec) - set(batch))
    if extra or missing:
        raise ValueError(f"{what} batch: fields {missing} missing, {extra} not in its "
                         f"contract {sorted(spec)}")
    sizes: dict[str, int] = {}
    for name, field in spec.items():
        value = np.asarray(batch[name])
        if value.dtype.kind not in _KINDS[field.kind]:
            raise ValueError(f"{what} batch field {name!r}: dtype {value.dtype}, expected "
                             f"{field.kind}")
        if value.ndim != len(field.shape):
            raise ValueError(f"{what} batch field {name!r}: shape {value.shape}, expected "
                             f"{field.shape}")
        for dim, size in zip(field.shape, value.shape, strict=True):
            expected = dim if isinstance(dim, int) else sizes.setdefault(dim, size)
            if size != expected:
                raise ValueError(f"{what} batch field {name!r}: shape {value.shape}, "
                                 f"{dim!r} should be {expected} ({field.shape})")


def checked_batches(factory: BatchFactory, spec: BatchSpec | None, what: str) -> BatchFactory:
    """``factory`` whose first batch is checked against ``spec`` (``None``: unchecked)."""
    if spec is None:
        return factory

    def make(start_step: int) -> Iterator[Mapping[str, np.ndarray]]:
        batches = iter(factory(start_step))
        for first in batches:
            check_batch(spec, first, what)
            yield first
            break
        yield from batches

    return make


# (params, global batch, dropout key) -> (scalar loss, {name: scalar}); traced under jit.
LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]
# start_step -> iterator over this process's host batches ({name: numpy array}), in order.
BatchFactory = Callable[[int], Iterator[Mapping[str, np.ndarray]]]
# (params, step) -> {metric name: float}; params are the sharded training params.
Evaluator = Callable[[Any, int], Mapping[str, float]]
# (config, total_steps) -> (optimizer, learning-rate schedule).
OptimizerFactory = Callable[[ml_collections.ConfigDict, int],
                            tuple[optax.GradientTransformation, optax.Schedule]]


@dataclasses.dataclass
class Task:
    """One model's training, as the core needs it (``docs/architecture.md``, "The Task
    seam", names each field)."""

    name: str
    init_params: Callable[[jax.Array], Any]
    loss_fn: LossFn
    make_batches: BatchFactory
    num_examples: int
    steps_per_epoch: int
    global_batch_size: int
    pretrained: Mapping[tuple[str, ...], Any] = dataclasses.field(default_factory=dict)
    evaluate: Evaluator | None = None
    run_files: Mapping[str, Callable[[Any], None]] = dataclasses.field(default_factory=dict)
    make_optimizer: OptimizerFactory | None = None
    summary: str = ""
    grad_accumulation: GradAccumulation | None = None
    logical_axis_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    table_update: FusedTableUpdate | None = None
    batch_spec: BatchSpec | None = None
    encoder_of: Callable[[Any, int], Any] | None = None
