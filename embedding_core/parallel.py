"""Device mesh, logical-axis rules, host-to-global batches and multi-host start-up.

The one way (docs/architecture.md): a 2-D mesh ``("data", "model")`` with Auto axis
types; parameters carry logical axis names and rules (``config.logical_axis_rules``, by
default ``LOGICAL_AXIS_RULES``) map them onto mesh axes, fitted to the mesh
(:func:`fit_rules`); host batches enter as global ``jax.Array`` through
``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

MESH_AXES = ("data", "model")
"""The mesh axes every run has (:func:`make_mesh`); rules may name only these."""

# Logical names used by the encoders and heads -> mesh axes (the defaults of
# ``config.logical_axis_rules``, docs/architecture.md "Mesh and logical axes"). Batch goes
# over "data". Entity tables ("entities") are split over "model" by rows: their row count
# is padded to a multiple of the model size (DocEnt's table_multiple). Word-piece tables
# ("vocab": BERT's 30,522 rows divide few mesh sizes) stay replicated; attention heads and
# the MLP width are split over "model" where the model size divides them.
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
    """``{logical axis name: sizes of the array dimensions that carry it}`` over the
    ``nn.LogicallyPartitioned`` leaves of ``abstract_tree`` (params or a train state)."""
    dims: dict[str, set[int]] = {}
    boxes = jax.tree.leaves(abstract_tree,
                            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    for box in boxes:
        if not isinstance(box, nn.LogicallyPartitioned):
            continue
        for name, size in zip(box.names, np.shape(box.value), strict=True):
            if isinstance(name, str):
                dims.setdefault(name, set()).add(int(size))
    return dims


def fit_rules(rules: LogicalRules, mesh: Mesh, abstract_tree: Any = None,
              sizes: Mapping[str, int] | None = None) -> tuple[tuple[str, Any], ...]:
    """The rules with every logical axis the mesh cannot split evenly replicated instead.

    A rule ``(name, mesh axis)`` is kept when the mesh axis size divides every dimension
    named ``name`` in ``abstract_tree`` and ``sizes[name]`` (a count the shapes do not
    show, e.g. ``{"heads": 12}``: the ``"heads"`` columns hold 12 attention heads, which
    are never cut). Otherwise the whole logical axis is replicated (``(name, None)``,
    the same for every array carrying it) and one warning names the axis, its sizes, the
    mesh axis and the fields to change; the run goes on. DocEnt's entity table is never
    replicated this way: its padding is checked against ``mesh_model`` first
    (``docent_jax.configs.validate_config``).

    Args:
      rules: ``(logical name, mesh axis | tuple of mesh axes | None)`` pairs.
      mesh: the mesh the arrays go to.
      abstract_tree: a tree whose leaves may be ``nn.LogicallyPartitioned`` boxes
        (``jax.eval_shape`` of an initialiser); None checks ``sizes`` alone.
      sizes: extra ``{logical name: count}`` the mesh axis must also divide.

    Returns:
      The rules, same order, with non-dividing entries set to ``None``.

    Raises:
      ValueError: a rule names a mesh axis the mesh lacks.
    """
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
    """Builds the ``("data", "model")`` mesh with Auto axis types.

    Args:
      data: data-parallel size; ``-1`` takes all devices left after ``model``.
      model: tensor/vocabulary-parallel size.
      devices: defaults to ``jax.devices()`` (all processes).

    Raises:
      ValueError: if ``data * model`` does not equal the number of devices.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if model < 1 or n % model:
        raise ValueError(f"mesh model={model} does not divide the {n} available devices")
    if data == -1:
        data = n // model
    if data * model != n:
        raise ValueError(
            f"mesh data={data} x model={model} = {data * model} devices, but {n} are available; "
            "set config.mesh_data=-1 to use all devices"
        )
    if devices == list(jax.devices()):
        return jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    return Mesh(np.asarray(devices).reshape(data, model), ("data", "model"),
                axis_types=(AxisType.Auto,) * 2)


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES,
                      sizes: Mapping[str, int] | None = None):
    """NamedShardings for a tree whose leaves may be ``nn.LogicallyPartitioned`` boxes.

    The rules are first fitted to the mesh (:func:`fit_rules`: a logical axis the mesh
    axis does not divide is replicated, with one warning). Unboxed leaves (optimizer
    counters, scalars) are replicated.
    """
    rules = fit_rules(rules, mesh, abstract_tree, sizes)
    specs = nn.get_partition_spec(abstract_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a batch: leading axis over ``data``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_global_batch(global_batch_size: int, mesh: Mesh) -> None:
    """Fails before any compilation when the batch cannot be split over the data axis.

    Raises:
      ValueError: naming the batch size, the data-parallel size and the process count.
    """
    data = mesh.shape["data"]
    if global_batch_size % data:
        raise ValueError(
            f"batch_size={global_batch_size} is not divisible by the data-parallel size "
            f"{data} (mesh data={data}, model={mesh.shape['model']}); choose a multiple of {data}"
        )
    if global_batch_size % jax.process_count():
        raise ValueError(
            f"batch_size={global_batch_size} is not divisible by the process count "
            f"{jax.process_count()}"
        )


def host_to_global(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles each process's slice of the batch into global arrays sharded over ``data``.

    Args:
      batch: this process's rows, ``[global_batch / process_count, ...]`` per entry;
        processes hold contiguous slices in process order.

    Returns:
      Global arrays ``[global_batch, ...]`` with a ``PartitionSpec("data")`` sharding.
    """
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in batch.items()
    }


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
) -> None:
    """Calls ``jax.distributed.initialize`` when a multi-process run is asked for.

    On TPU pods ``jax.distributed.initialize()`` finds everything itself; pass
    ``coordinator_address="auto"`` for that. On CPU (tests, local multi-process runs) the
    gloo collectives are selected so cross-process all-reduces work.
    Nothing happens when ``coordinator_address`` is empty and ``JAX_COORDINATOR_ADDRESS`` is
    unset, or when this process has already started (a later call in the same program).
    """
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator_address or jax.distributed.is_initialized():
        return
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address == "auto":
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=local_device_ids,
        )
    logging.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
    )


def mesh_from_config(config: Any) -> Mesh:
    """Multi-host start-up (if asked) and the mesh, from the fields every config shares.

    Reads ``coordinator_address``, ``num_processes``, ``process_id`` (``-1`` = unset),
    ``mesh_data`` and ``mesh_model``.
    """
    maybe_initialize_distributed(
        config.coordinator_address or None,
        config.num_processes or None,
        config.process_id if config.process_id >= 0 else None,
    )
    return make_mesh(int(config.mesh_data), int(config.mesh_model))
