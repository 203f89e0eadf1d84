"""Ahead-of-time compilation for a TPU slice that is not there: chips, meshes, analysis.

``jax.experimental.topologies.get_topology_desc("v5e:8x8", platform="tpu")`` gives the
devices of a slice; programs lowered with ``NamedSharding``s over a mesh of them and
compiled here are built by the TPU compiler in ``libtpu`` (installed by ``make
install-tpu`` into ``.venv/tpu-compiler``, found through ``TPU_LIBRARY_PATH``), on this CPU.
:func:`analyse` reads the executable: per-device memory (``memory_analysis``), FLOPs and
HBM bytes (``cost_analysis``), the collectives of the optimised HLO, and a roofline bound
on step time. Chip figures and their sources: ``docs/performance.md``, "TPU compiler".

Import this module before JAX starts (it sets ``TPU_LIBRARY_PATH`` and
``JAX_PLATFORMS=cpu``, so nothing tries to open a TPU).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBTPU = ROOT / ".venv" / "tpu-compiler" / "libtpu" / "libtpu.so"
if "TPU_LIBRARY_PATH" not in os.environ and LIBTPU.is_file():
    os.environ["TPU_LIBRARY_PATH"] = str(LIBTPU)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# libtpu locks /tmp/libtpu_lockfile for the chips of this host; compiling opens none, so
# several compiling processes (a plan beside the tests) may share it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402

GIB, GB = 2**30, 10**9


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation as Cloud TPU's documentation gives it (per chip).

    ``cores``: devices the topology API lists per chip (v4: its 2 TensorCores; a real v4
    slice runs them as one megacore device). ``ici_bytes_per_s``: one direction, per chip.
    """

    name: str
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float
    cores: int = 1


CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, 275e12, 1200e9, 1.1e15 / 4096, cores=2),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GB, 197e12, 819e9, 200e9),
    "v5p": Chip("v5p", "TPU v5", 95 * GB, 459e12, 2765e9, 600e9),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GB, 918e12, 1638e9, 400e9),
}
"""Sources and derivations: ``docs/performance.md``, "TPU compiler"."""


def libtpu_version() -> str | None:
    """The installed libtpu's version (``make install-tpu``), or None."""
    for where in (LIBTPU.parents[1], None):
        try:
            dists = importlib.metadata.distributions(path=[str(where)]) if where else \
                importlib.metadata.distributions()
            for dist in dists:
                if dist.metadata["Name"] == "libtpu":
                    return dist.version
        except OSError:
            continue
    return None


def required_libtpu() -> str:
    """The libtpu requirement of the installed jax's ``tpu`` extra (``libtpu==0.0.42.*``)."""
    for req in importlib.metadata.requires("jax") or []:
        if req.startswith("libtpu") and 'extra == "tpu"' in req:
            return req.split(";")[0].strip()
    raise RuntimeError("the installed jax names no libtpu for its tpu extra")


def unavailable() -> str | None:
    """Why the TPU compiler cannot run here (one line), or None when it can."""
    path = os.environ.get("TPU_LIBRARY_PATH")
    if not (path and Path(path).is_file()) and libtpu_version() is None:
        return (f"no libtpu: run `make install-tpu` (installs {required_libtpu()} into "
                f"{LIBTPU.parents[1]})")
    return None


def topology(name: str):
    """The devices of slice ``name`` (``"v5e:8x8"``) and its :class:`Chip`.

    Raises:
      ValueError: an unknown generation or a topology libtpu refuses (one line).
    """
    from jax.experimental import topologies

    generation = name.split(":")[0]
    if generation not in CHIPS:
        raise ValueError(f"unknown TPU generation in {name!r}: one of {sorted(CHIPS)}")
    try:
        devices = topologies.get_topology_desc(name, platform="tpu").devices
    except Exception as e:  # XlaRuntimeError: libtpu's own message, first line
        raise ValueError(f"TPU topology {name!r}: {str(e).splitlines()[0]}") from None
    chip = CHIPS[generation]
    if devices[0].device_kind != chip.device_kind:
        raise ValueError(f"{name}: libtpu gives {devices[0].device_kind!r} devices, expected "
                         f"{chip.device_kind!r}")
    return devices, chip


def chips_of(name: str) -> int:
    """Chips in slice ``name`` (the product of its dimensions)."""
    return int(np.prod([int(x) for x in name.split(":")[1].split("x")]))


def mesh_of(devices, data: int = -1, model: int = 1) -> Mesh:
    """The ``("data", "model")`` mesh over ``devices``, laid out along the slice's ICI
    (``mesh_utils.create_device_mesh``) as ``parallel.make_mesh`` lays out real devices;
    v4's cores in the order listed (a chip's two cores side by side).

    Raises:
      ValueError: ``data * model`` is not the device count.
    """
    from jax.experimental import mesh_utils

    n = len(devices)
    data = n // model if data == -1 else data
    if data * model != n:
        raise ValueError(f"mesh {data}x{model} needs {data * model} devices, the slice has {n}")
    try:
        grid = mesh_utils.create_device_mesh((data, model), devices=devices,
                                             allow_split_physical_axes=True)
    except AssertionError:  # v4's two cores a chip (no megacore here): the listed order
        grid = np.asarray(devices).reshape(data, model)
    return Mesh(grid, ("data", "model"), axis_types=(AxisType.Auto,) * 2)


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.*?)\s(all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute)(-start)?\(")
_SHAPE = re.compile(r"(pred|s8|u8|s16|u16|s32|u32|s64|u64|bf16|f16|f32|f64)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_GROUPS = re.compile(
    r"replica_groups=(\{(?:\{[0-9,]*\},?)*\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?|"
    r"mesh\[[^\]]*\](?:,\s*device_ids=\(\[[0-9,]+\](?:T\([0-9,]+\))?\))?\s*\{[^}]*\})")
_MESH_AXIS = re.compile(r"'([^']+)'=([0-9]+)")
_CHANNEL = re.compile(r"channel_id=([0-9]+)")


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        total += _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def _groups(line: str, n_devices: int) -> frozenset | None:
    """The replica groups of a collective line as sets of logical device ids (positions in
    the mesh's flattened device order): TPU's ``mesh['axis_0'=4,...] {'axis_0'}``, iota
    ``[g,s]<=[dims]T(perm)`` or ``{{0,1},...}``; None when the line names none."""
    match = _GROUPS.search(line)
    if not match:
        return None
    text = match.group(1)
    if text.startswith("mesh"):
        axes = [(a, int(s)) for a, s in _MESH_AXIS.findall(text[:text.index("]")])]
        braced = set(re.findall(r"'([^']+)'", text[text.index("{"):]))
        order = np.arange(n_devices)
        where = re.search(r"device_ids=\(\[([0-9,]+)\](?:T\(([0-9,]+)\))?\)", text)
        if where:  # the mesh's devices: an iota of these dims, transposed
            order = order.reshape([int(x) for x in where.group(1).split(",")])
            if where.group(2):
                order = order.transpose([int(x) for x in where.group(2).split(",")])
        ids = order.reshape([s for _, s in axes])
        keep = [i for i, (a, _) in enumerate(axes) if a in braced]
        rest = [i for i in range(len(axes)) if i not in keep]
        flat = ids.transpose(rest + keep).reshape(-1, int(np.prod([axes[i][1] for i in keep])))
        return frozenset(frozenset(g.tolist()) for g in flat)
    if text.startswith("["):
        shape = [int(x) for x in text[1:text.index("]")].split(",")]
        dims = [int(x) for x in re.search(r"<=\[([0-9,]+)\]", text).group(1).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        perm = re.search(r"T\(([0-9,]+)\)", text)
        if perm:
            ids = ids.transpose([int(x) for x in perm.group(1).split(",")])
        return frozenset(frozenset(g.tolist()) for g in ids.reshape(shape[0], -1))
    return frozenset(frozenset(int(x) for x in g.split(",") if x)
                     for g in re.findall(r"\{([0-9,]*)\}", text))


def _axis_groups(mesh: Mesh) -> dict[frozenset, str]:
    """``{groups: name}`` for each set of mesh axes a collective may span."""
    ids = np.arange(mesh.size).reshape(mesh.devices.shape)
    names = list(mesh.axis_names)
    out = {}
    for keep in ([1], [0], [0, 1]):
        rest = [i for i in range(len(names)) if i not in keep]
        flat = ids.transpose(rest + keep).reshape(-1, int(np.prod([ids.shape[i] for i in keep])))
        groups = frozenset(frozenset(g.tolist()) for g in flat)
        out.setdefault(groups, "+".join(names[i] for i in keep))
    return out


_HEADER = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"(body|condition|calls|to_apply)=%([\w.\-]+)")
_BOUND = re.compile(r"s(?:32|64)\[\](?:\{[^}]*\})?\s*constant\((\d+)\)")
_CALL_LISTS = re.compile(r"(?:called_computations|branch_computations)=\{([^}]*)\}")


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """``({computation: its lines}, entry name)`` of an HLO module's text."""
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            comps[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif current is not None:
            comps[current].append(line)
    return comps, entry


def _executions(comps: dict[str, list[str]], entry: str) -> dict[str, int]:
    """Times each computation runs per call of ``entry``: a while body as often as the
    largest integer constant of its condition (the loop bound; an upper bound on the trip
    count), anything else called once per call of its caller."""
    callers: dict[str, list[tuple[str, int]]] = {}
    for name, lines in comps.items():
        for line in lines:
            refs = dict((k, v) for k, v in _CALLS.findall(line))
            trips = 1
            if "body" in refs and "condition" in refs:
                cond = "\n".join(comps.get(refs["condition"], []))
                bounds = [int(x) for x in _BOUND.findall(cond)]
                trips = max(bounds or [1])
            for kind, callee in refs.items():
                callers.setdefault(callee, []).append((name, trips if kind == "body" else 1))
            for group in _CALL_LISTS.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    callers.setdefault(callee, []).append((name, 1))
    memo: dict[str, int] = {entry: 1}

    def count(name: str, seen: frozenset = frozenset()) -> int:
        if name not in memo:
            memo[name] = sum(count(p, seen | {name}) * f for p, f in callers.get(name, [])
                             if p not in seen)
        return memo[name]

    return {name: count(name) for name in comps}


def collectives(hlo_text: str, mesh: Mesh) -> list[dict]:
    """The collectives one call of an optimised HLO module runs: ``{"kind", "axis",
    "bytes", "count", "max_op_bytes"}`` per (kind, axis); bytes = result bytes per device,
    times the executions of the computation holding the op (loop bodies: their bound), an
    async op counted once however many computations it appears in. ``axis``: the mesh
    axes its replica groups span (``"data"``, ``"model"``, ``"data+model"`` or
    ``"groups of N"``), ``"permute"`` for a collective-permute."""
    comps, entry = _computations(hlo_text)
    runs = _executions(comps, entry)
    return _collectives(comps, runs, mesh)


def loop_bodies(hlo_text: str) -> int:
    """How many computations of the module run more than once per call (while bodies and
    what they call): XLA's ``cost_analysis`` counts each of them once."""
    comps, entry = _computations(hlo_text)
    return sum(1 for n in _executions(comps, entry).values() if n > 1)


def _collectives(comps: dict[str, list[str]], runs: dict[str, int], mesh: Mesh) -> list[dict]:
    n = mesh.size
    named = _axis_groups(mesh)
    ops: dict = {}
    for comp, lines in comps.items():
        for line in lines:
            m = _COLLECTIVE.search(line)
            if not m or "-done(" in line:
                continue
            channel = _CHANNEL.search(line)
            groups = _GROUPS.search(line)
            shape = re.sub(r"\{[^}]*\}", "", m.group(1))  # layouts differ between copies
            key = (m.group(2), channel.group(1) if channel else id(line), shape,
                   groups.group(1) if groups else "")
            nbytes = _shape_bytes(m.group(1))
            total = nbytes * max(runs.get(comp, 1), 1)
            if total >= ops.get(key, (0, 0, ""))[1]:
                ops[key] = (nbytes, total, line, max(runs.get(comp, 1), 1))
    out: dict[tuple[str, str], dict] = {}
    for (kind, *_), (nbytes, total, line, times) in ops.items():
        groups = _groups(line, n) or frozenset([frozenset(range(n))])
        if kind == "collective-permute":
            axis = "permute"
        elif max(len(g) for g in groups) == 1:
            continue  # groups of one device move nothing
        else:
            axis = named.get(groups, f"groups of {max(len(g) for g in groups)}")
            if axis == "data+model" and 1 in mesh.devices.shape:
                axis = [a for a, s in dict(mesh.shape).items() if s > 1][0]
        entry = out.setdefault((kind, axis), {"kind": kind, "axis": axis, "bytes": 0,
                                              "count": 0, "max_op_bytes": 0})
        entry["bytes"] += total
        entry["count"] += times
        entry["max_op_bytes"] = max(entry["max_op_bytes"], nbytes)
    return sorted(out.values(), key=lambda e: -e["bytes"])


def analyse(compiled, mesh: Mesh, chip: Chip, examples: int) -> dict:
    """Per-chip figures of a compiled per-device program over ``mesh``.

    ``hbm_bytes`` = arguments + outputs + temporaries - aliased (donated) per device, x
    ``chip.cores`` per chip; ``step_time_bound_s`` = max(FLOPs / peak, HBM bytes / HBM
    bandwidth) + collective bytes / ICI bandwidth, per chip; ``mfu_bound`` = the FLOPs
    term over that bound; ``examples_per_s_per_chip`` = ``examples`` (per step, whole
    mesh) / chips / bound. FLOPs and HBM traffic are XLA's ``cost_analysis``, which counts
    a loop body once (``loop_bodies_counted_once`` > 0: the bound is looser); collective
    bytes count every iteration (:func:`collectives`).
    """
    mem = compiled.memory_analysis()
    per_device = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                  + mem.temp_size_in_bytes - mem.alias_size_in_bytes)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) * chip.cores
    hbm_traffic = float(cost.get("bytes accessed", 0.0)) * chip.cores
    text = compiled.as_text()
    found = collectives(text, mesh)
    collective_bytes = sum(e["bytes"] for e in found) * chip.cores
    compute_s, memory_s = flops / chip.peak_bf16_flops, hbm_traffic / chip.hbm_bytes_per_s
    bound = max(compute_s, memory_s) + collective_bytes / chip.ici_bytes_per_s
    chips = mesh.size // chip.cores
    hbm = per_device * chip.cores
    return {
        "device_kind": mesh.devices.flat[0].device_kind, "chips": chips,
        "mesh": dict(mesh.shape),
        "hbm_bytes": int(hbm), "hbm_capacity_bytes": int(chip.hbm_bytes),
        "fits": bool(hbm <= chip.hbm_bytes),
        "temp_bytes": int(mem.temp_size_in_bytes) * chip.cores,
        "arg_bytes": int(mem.argument_size_in_bytes) * chip.cores,
        "flops": flops, "hbm_traffic_bytes": hbm_traffic,
        "collective_bytes": int(collective_bytes), "collectives": found,
        "step_time_bound_s": bound, "bound_by": "compute" if compute_s >= memory_s else "HBM",
        "mfu_bound": compute_s / bound if bound else 0.0,
        "loop_bodies_counted_once": loop_bodies(text),
        "examples_per_s_per_chip": examples / chips / bound if bound else 0.0,
    }
