"""Device mesh, logical-axis rules, host batch <-> global arrays, multi-host start-up
(``docs/architecture.md``, "Mesh and logical axes")."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

MESH_AXES = ("data", "model")  # every run's (make_mesh); rules may name only these

# Defaults of config.logical_axis_rules (the table in docs/architecture.md).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("vocab", None),
    ("entities", "model"),
    ("heads", "model"),
    ("mlp", "model"),
    ("embed", None),
    ("length", None),
)

_REPORTED: set[str] = set()


def _axis_size(mesh: Mesh, axes: str | tuple[str, ...]) -> int:
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    unknown = [a for a in names if a not in mesh.shape]
    if unknown:
        raise ValueError(f"config.logical_axis_rules maps to mesh axis {unknown[0]!r}; the "
                         f"mesh has {tuple(mesh.shape)}")
    return int(np.prod([mesh.shape[a] for a in names]))


def logical_dims(abstract_tree: Any) -> dict[str, set[int]]:
    """``{logical axis: sizes of the dimensions carrying it}`` of the boxed leaves."""
    dims: dict[str, set[int]] = {}
    boxes = jax.tree.leaves(abstract_tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    for box in boxes:
        if not isinstance(box, nn.LogicallyPartitioned):
            continue
        for name, size in zip(box.names, np.shape(box.value), strict=True):
            if isinstance(name, str):
                dims.setdefault(name, set()).add(int(size))
    return dims


def fit_rules(rules: LogicalRules, mesh: Mesh, abstract_tree: Any = None,
              sizes: Mapping[str, int] | None = None) -> tuple[tuple[str, Any], ...]:
    """The rules, each logical axis the mesh cannot split evenly (in ``abstract_tree`` or
    ``sizes``, e.g. ``{"heads": 12}``) replicated with one warning. Raises ValueError: a
    mesh axis the mesh lacks."""
    dims = logical_dims(abstract_tree) if abstract_tree is not None else {}
    for name, count in (sizes or {}).items():
        dims.setdefault(name, set()).add(int(count))
    fitted = []
    for name, axes in rules:
        if axes is None or axes == "":
            fitted.append((name, None))
            continue
        n = _axis_size(mesh, axes)
        bad = sorted(d for d in dims.get(name, ()) if d % n)
        if bad:
            sizes_text = ", ".join(map(str, bad))
            message = (f"logical axis {name!r} (size {sizes_text}) does not split evenly "
                       f"over mesh axis {axes!r} = {n}: replicated instead (use a mesh size "
                       f"dividing {sizes_text}, or --config.logical_axis_rules="
                       f"\"(('{name}', ''),)\" to replicate it without this warning)")
            if message not in _REPORTED:
                _REPORTED.add(message)
                logging.warning(message)
            fitted.append((name, None))
        else:
            fitted.append((name, axes))
    return tuple(fitted)


def make_mesh(data: int = -1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ``("data", "model")`` Auto mesh; ``data=-1`` takes the rest. Raises ValueError:
    ``data * model`` is not the number of devices."""
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if model < 1 or n % model:
        raise ValueError(f"mesh model={model} does not divide the {n} available devices")
    if data == -1:
        data = n // model
    if data * model != n:
        raise ValueError(
            f"mesh data={data} x model={model} = {data * model} devices, but {n} are available; "
            "set config.mesh_data=-1 to use all devices")
    if devices == list(jax.devices()):
        return jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    return Mesh(np.asarray(devices).reshape(data, model), ("data", "model"),
                axis_types=(AxisType.Auto,) * 2)


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES,
                      sizes: Mapping[str, int] | None = None):
    """NamedShardings of boxed leaves by :func:`fit_rules`; unboxed ones replicated."""
    rules = fit_rules(rules, mesh, abstract_tree, sizes)
    specs = nn.get_partition_spec(abstract_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading axis over ``data``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_global_batch(global_batch_size: int, mesh: Mesh) -> None:
    """Raises ValueError when the batch does not split over data devices or processes."""
    data = mesh.shape["data"]
    if global_batch_size % data:
        raise ValueError(
            f"batch_size={global_batch_size} is not divisible by the data-parallel size "
            f"{data} (mesh data={data}, model={mesh.shape['model']}); choose a multiple of {data}")
    if global_batch_size % jax.process_count():
        raise ValueError(f"batch_size={global_batch_size} is not divisible by the process "
                         f"count {jax.process_count()}")


def host_to_global(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's contiguous rows as global arrays sharded over ``data``."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}


def iter_row_blocks(array: Any, num_rows: int | None = None, block_rows: int = 8192
                    ) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, numpy block)`` of rows ``[0, num_rows)``, shard by shard (nothing
    gathered). Raises ValueError: bad arguments, rows on another process's devices."""
    total = int(array.shape[0])
    num_rows = total if num_rows is None else int(num_rows)
    if isinstance(block_rows, bool) or int(block_rows) != block_rows or block_rows < 1:
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    if not 0 <= num_rows <= total:
        raise ValueError(f"num_rows={num_rows} must lie in [0, {total}]")
    if not isinstance(array, jax.Array):
        for start in range(0, num_rows, block_rows):
            yield start, np.asarray(array[start:min(start + block_rows, num_rows)])
        return
    pieces: dict[int, tuple[int, Any]] = {}
    for shard in array.addressable_shards:
        rows = shard.index[0] if shard.index else slice(None)
        start = rows.start or 0
        stop = total if rows.stop is None else rows.stop
        pieces.setdefault(start, (stop, shard.data))
    position = 0
    while position < num_rows:
        if position not in pieces:
            raise ValueError(f"rows from {position} of a [{total}, ...] array lie on another "
                             "process's devices; read the array where it is whole (e.g. a "
                             "model axis within one host)")
        stop, data = pieces[position]
        stop = min(stop, num_rows)
        rows_here = int(data.shape[0])
        size = min(int(block_rows), rows_here)
        for begin in range(0, stop - position, size):
            n = min(size, stop - position - begin)
            if size == rows_here:
                block = np.asarray(data)[begin:begin + n]
            else:  # the slice is taken on the shard's device; only it is copied
                first = min(begin, rows_here - size)
                block = np.asarray(_device_rows(size)(data, first))[begin - first:
                                                                   begin - first + n]
            yield position + begin, block
        position = stop


@functools.lru_cache(maxsize=8)
def _device_rows(size: int):
    return jax.jit(lambda x, start: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0))


def maybe_initialize_distributed(coordinator_address: str | None = None,
                                 num_processes: int | None = None, process_id: int | None = None,
                                 local_device_ids: Sequence[int] | None = None) -> None:
    """``jax.distributed.initialize`` (``"auto"``: TPU pods; CPU: gloo) where an address or
    ``JAX_COORDINATOR_ADDRESS`` is given and it has not run."""
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator_address or jax.distributed.is_initialized():
        return
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address == "auto":
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id,
                                   local_device_ids=local_device_ids)
    logging.info("process %d of %d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


def mesh_from_config(config: Any) -> Mesh:
    """Multi-host start-up (if asked) and the mesh of the config's fields."""
    maybe_initialize_distributed(
        config.coordinator_address or None,
        config.num_processes or None,
        config.process_id if config.process_id >= 0 else None,
    )
    return make_mesh(int(config.mesh_data), int(config.mesh_model))
