"""Evaluation and export on several processes: each computes its slice, process 0 writes
(``docs/architecture.md``, "Several processes"). Gathers are collectives."""

from __future__ import annotations

import functools
import itertools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

T = TypeVar("T")
_STATUS_BYTES = 4096  # of the status each process sends before a gather (longer: cut)
# Re-raised under their own name on the processes that did not fail.
_KNOWN_ERRORS = {cls.__name__: cls for cls in (ValueError, TypeError, KeyError,
                                                FileNotFoundError, OSError, RuntimeError)}
# A host compiling minutes after its peers must not fail the run; one that never comes does.
BARRIER_TIMEOUT_S = 30 * 60
_barriers = itertools.count()  # every process passes the same barriers in the same order


class PeerProcessError(RuntimeError):
    """Another process failed; this one stops too (the message is the peer's error)."""


def is_primary() -> bool:
    """Whether this process writes the result files (process 0; always true alone)."""
    return jax.process_index() == 0


def barrier(what: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Returns once every process has called it, through JAX's coordination service (a
    gloo collective gives up after 30 s). Raises TimeoutError, RuntimeError."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed

    name = f"embedding_jax_{next(_barriers)}_{what}"
    client = distributed.global_state.client
    if client is None:  # several processes without jax.distributed: only a collective
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
        return
    logging.info("%s: process %d of %d waits for the others (up to %g s)", what,
                 jax.process_index(), jax.process_count(), timeout_s)
    try:
        client.wait_at_barrier(name, int(timeout_s * 1000))
    except jax.errors.JaxRuntimeError as err:
        first = (str(err).splitlines() or [""])[0]
        if "DEADLINE_EXCEEDED" in first:
            raise TimeoutError(f"{what}: process {jax.process_index()} waited {timeout_s:g} "
                               "s for the other processes, which did not all come") from None
        raise RuntimeError(f"{what}: process {jax.process_index()} waiting for the other "
                           f"processes: {first}") from None


def process_rows(total: int, index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """Process ``index``'s ``[start, stop)`` of ``total`` rows (10 on 3: ``[0, 4)``,
    ``[4, 7)``, ``[7, 10)``). Raises ValueError: negative ``total``, ``index`` outside."""
    index = jax.process_index() if index is None else int(index)
    count = jax.process_count() if count is None else int(count)
    if total < 0 or not 0 <= index < count:
        raise ValueError(f"process_rows: total={total} must be >= 0 and index={index} in "
                         f"[0, {count})")
    base, extra = divmod(int(total), count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def splits(total: int) -> bool:
    """Whether :func:`split_map` splits ``total`` rows (several processes, a row each)."""
    return jax.process_count() > 1 and total >= jax.process_count()


def _allgather_bytes(payload: bytes) -> list[bytes]:
    """Every process's ``payload`` (cut to the fixed size), in process order."""
    from jax.experimental import multihost_utils

    payload = payload[:_STATUS_BYTES - 4]
    buf = np.zeros(_STATUS_BYTES, np.uint8)
    buf[:4] = np.frombuffer(np.uint32(len(payload)).tobytes(), np.uint8)
    buf[4:4 + len(payload)] = np.frombuffer(payload, np.uint8)
    out = np.asarray(multihost_utils.process_allgather(buf))
    return [row[4:4 + int(row[:4].view(np.uint32)[0])].tobytes() for row in out]


def _status(payload: bytes) -> dict[str, Any]:
    try:
        return json.loads(payload.decode("utf-8"))
    except ValueError:  # cut short: a status too long is a failure all the same
        return {"ok": False, "message": payload[:200].decode("utf-8", "replace")}


def agree(error: BaseException | None, what: str, **info: Any) -> list[dict[str, Any]]:
    """Every process's ``{"ok": True, **info}``; where one failed, it raises its ``error``
    and the others its type (or :class:`PeerProcessError`) with its message."""
    if jax.process_count() == 1:
        if error is not None:
            raise error
        return [{"ok": True, **info}]
    status = {"ok": error is None, **info}
    if error is not None:
        # Cut so that the JSON fits the fixed-size message with room for ``info``.
        status.update(type=type(error).__name__, message=str(error)[:_STATUS_BYTES // 2])
    statuses = [_status(b) for b in _allgather_bytes(json.dumps(status).encode("utf-8"))]
    failed = [(i, s) for i, s in enumerate(statuses) if not s.get("ok")]
    if not failed:
        return statuses
    if error is not None:
        raise error
    index, peer = failed[0]
    cls = _KNOWN_ERRORS.get(peer.get("type", ""), PeerProcessError)
    raise cls(f"{what}: process {index} failed: {peer.get('message', '(message cut)')}")


def _allgather_raw(raw: np.ndarray, size: int) -> np.ndarray:
    # Bytes survive JAX's 32-bit default types. A power of two (few compiled gathers), never
    # the status size: a process one exchange behind fails on the shape.
    from jax.experimental import multihost_utils

    buf = np.zeros(max(2 * _STATUS_BYTES, 1 << (size - 1).bit_length()), np.uint8)
    buf[:raw.size] = raw
    return np.asarray(multihost_utils.process_allgather(buf))


def _gather_leaf(local: np.ndarray, total: int) -> np.ndarray:
    local = np.ascontiguousarray(local)
    count = jax.process_count()
    per = -(-total // count)
    sizes = [b - a for a, b in (process_rows(total, i, count) for i in range(count))]
    row_shape = local.shape[1:]
    width = int(np.prod(row_shape, dtype=np.int64)) * local.dtype.itemsize
    if width == 0:
        return np.zeros((total, *row_shape), local.dtype)
    stacked = _allgather_raw(local.reshape(-1).view(np.uint8), per * width)
    rows = np.concatenate([stacked[i, :n * width] for i, n in enumerate(sizes)])
    return rows.view(local.dtype).reshape(total, *row_shape)


def sum_over_processes(local: np.ndarray, block_rows: int = 4096) -> np.ndarray:
    """Every process's ``local`` summed in process order, in its dtype, ``block_rows`` rows
    exchanged at a time (a collective)."""
    local = np.ascontiguousarray(local)
    if jax.process_count() == 1 or local.size == 0:
        return local
    out = np.empty_like(local)
    for start in range(0, len(local), block_rows):
        part = local[start:start + block_rows]
        raw = part.reshape(-1).view(np.uint8)
        stacked = _allgather_raw(raw, raw.size)[:, :raw.size]
        parts = [row.view(local.dtype).reshape(part.shape) for row in stacked]
        total = parts[0].copy()
        for other in parts[1:]:
            total += other
        out[start:start + len(part)] = total
    return out


def split_map(fn: Callable[[int, int], T], total: int, *, what: str = "rows") -> T:
    """``fn(0, total)`` as one ``fn(start, stop)`` slice per process, gathered everywhere.
    Raises what ``fn`` raised (:func:`agree`); ValueError: results of another shape."""
    if not splits(total):
        return fn(0, total)
    start, stop = process_rows(total)
    logging.debug("process %d of %d: %s [%d, %d) of %d", jax.process_index(),
                  jax.process_count(), what, start, stop, total)
    result, error, kinds = None, None, []
    try:
        result = fn(start, stop)
        for leaf in map(np.asarray, jax.tree.leaves(result)):
            if leaf.ndim < 1 or len(leaf) != stop - start:
                raise ValueError(f"{what}: a result of shape {leaf.shape} for rows "
                                 f"[{start}, {stop}) ({stop - start} rows expected)")
            kinds.append([leaf.dtype.str, list(leaf.shape[1:])])
    except Exception as err:  # reported to the peers by agree(), then re-raised
        error = err
    statuses = agree(error, what, kinds=kinds)
    if any(s.get("kinds") != kinds for s in statuses):
        # Every process sees the same statuses, so all raise here together.
        raise ValueError(f"{what}: the processes' results differ in dtype or row shape "
                         f"({[s.get('kinds') for s in statuses]})")
    return jax.tree.map(lambda leaf: _gather_leaf(np.asarray(leaf), total), result)


def is_local(tree: Any) -> bool:
    """Whether every ``jax.Array`` of ``tree`` lives on this process's devices alone."""
    return all(not isinstance(x, jax.Array) or x.is_fully_addressable
               for x in jax.tree.leaves(tree))


@functools.lru_cache(maxsize=8)
def _local_mesh(mesh: Mesh, process: int) -> Mesh:
    devices = np.asarray(mesh.devices)
    mine = np.vectorize(lambda d: d.process_index == process)(devices)
    coords = [np.unique(ix) for ix in np.nonzero(mine)]
    block = devices[np.ix_(*coords)]
    if block.size != int(mine.sum()) or not all(d.process_index == process for d in block.flat):
        raise ValueError(f"the devices of process {process} do not form a block of the mesh "
                         f"{dict(mesh.shape)}; cannot copy the params onto them alone")
    return Mesh(block, mesh.axis_names, axis_types=mesh.axis_types)


def _spec_axes(spec: PartitionSpec) -> set[str]:
    axes: set[str] = set()
    for entry in spec:
        if entry is None:
            continue
        axes.update(entry if isinstance(entry, tuple) else (entry,))
    return axes


def localize(tree: Any) -> Any:
    """``tree``'s global arrays re-wrapped, not copied, on this process's block of the mesh.
    Raises ValueError: an array split across processes."""
    if jax.process_count() == 1:
        return tree

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        sharding = x.sharding
        if not isinstance(sharding, NamedSharding):
            raise ValueError(f"cannot make an array with sharding {sharding} process-local")
        local = _local_mesh(sharding.mesh, jax.process_index())
        for axis in _spec_axes(sharding.spec):
            if local.shape[axis] != sharding.mesh.shape[axis]:
                raise ValueError(
                    f"an array of shape {x.shape} is split over mesh axis {axis!r} across "
                    f"processes ({sharding.mesh.shape[axis]} ways, {local.shape[axis]} on "
                    "this one); evaluate and export need a whole copy on every process: "
                    "keep that axis within one host (e.g. a smaller mesh_model)")
        return jax.make_array_from_single_device_arrays(
            x.shape, NamedSharding(local, sharding.spec),
            [shard.data for shard in x.addressable_shards])

    return jax.tree.map(one, tree)


def encode(encoder: Any, texts: Sequence[str], **kwargs: Any) -> np.ndarray:
    """``encoder.encode(texts)`` float32 on every process, each encoding its slice (all of
    it when the params are global)."""
    from embedding_core.errors import check_texts

    texts = check_texts(texts)
    if not is_local(getattr(encoder, "params", None)):
        return encoder.encode(texts, **kwargs)
    return split_map(lambda a, b: encoder.encode(texts[a:b], **kwargs), len(texts), what="encode")
