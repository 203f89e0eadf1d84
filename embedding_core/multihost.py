"""Evaluation and export on several processes: each encodes its slice, process 0 writes.

In a multi-process JAX program (``jax.distributed``, e.g. a TPU pod slice) every process
runs the same ``evaluate`` or ``export`` call. Instead of each repeating all of the work,
the rows of each piece of work (texts to encode, queries to rank) are cut into
``process_count`` contiguous slices in process order (:func:`process_rows`); each process
computes its slice on its own devices with no cross-process collective inside the model
(the model's params are made process-local by :func:`localize`), and the slices are
gathered so that every process ends with the same array as a single process would
compute (:func:`split_map`). Result files are written by process 0 alone
(:func:`is_primary`; ``embedding_core.export`` does so for exports). See
``docs/architecture.md`` ("Several processes").

Every function that gathers is a collective: all processes call it in the same order with
the same ``total``, as they do in the SPMD programs of this library. An exception raised
by one process's slice is reported to all of them (each raises), so no process is left
waiting for a peer that stopped. In a single process nothing is split, gathered or
synchronised.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

T = TypeVar("T")
# Bytes of the status message each process sends before a gather (longer text is cut).
_STATUS_BYTES = 4096
# Exception types re-raised under their own name on the processes that did not fail.
_KNOWN_ERRORS = {cls.__name__: cls for cls in (ValueError, TypeError, KeyError,
                                                FileNotFoundError, OSError, RuntimeError)}


class PeerProcessError(RuntimeError):
    """Another process failed; this one stops too (the message is the peer's error)."""


def is_primary() -> bool:
    """Whether this process writes the result files (process 0; always true alone)."""
    return jax.process_index() == 0


def process_rows(total: int, index: int | None = None, count: int | None = None
                 ) -> tuple[int, int]:
    """This process's contiguous slice ``[start, stop)`` of ``total`` rows.

    The first ``total % count`` processes get one row more; slices follow process order
    (e.g. 10 rows on 3 processes: ``[0, 4)``, ``[4, 7)``, ``[7, 10)``).

    Args:
      total: rows to split, >= 0.
      index, count: the process and the process count (default: this JAX process).

    Raises:
      ValueError: a negative ``total`` or an ``index`` outside ``[0, count)``.
    """
    index = jax.process_index() if index is None else int(index)
    count = jax.process_count() if count is None else int(count)
    if total < 0 or not 0 <= index < count:
        raise ValueError(f"process_rows: total={total} must be >= 0 and index={index} in "
                         f"[0, {count})")
    base, extra = divmod(int(total), count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def splits(total: int) -> bool:
    """Whether :func:`split_map` splits ``total`` rows: several processes, and at least one
    row for each (fewer rows are computed whole by every process: too few to matter)."""
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
    """Exchanges every process's outcome of a step; raises on all if any failed.

    A collective: each process passes the exception its own part raised (or None). A
    process that failed re-raises its own exception; the others raise the same type (or
    :class:`PeerProcessError`) with the first failed peer's message, so none waits for a
    peer that has stopped.

    Args:
      error: this process's exception, or None.
      what: names the step in the peers' messages.
      **info: JSON-serialisable facts sent along (e.g. result shapes to compare).

    Returns:
      The exchanged status of every process (``{"ok": True, **info}``), when all
      succeeded.
    """
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


def _gather_leaf(local: np.ndarray, total: int) -> np.ndarray:
    from jax.experimental import multihost_utils

    local = np.ascontiguousarray(local)
    count = jax.process_count()
    per = -(-total // count)
    sizes = [b - a for a, b in (process_rows(total, i, count) for i in range(count))]
    row_shape = local.shape[1:]
    width = int(np.prod(row_shape, dtype=np.int64)) * local.dtype.itemsize
    if width == 0:
        return np.zeros((total, *row_shape), local.dtype)
    # Bytes, not values: float64 and int64 survive JAX's default 32-bit types unchanged.
    # The buffer is padded to a power of two so that few gather programs are compiled,
    # and is never the status message's size: a process that is one exchange behind its
    # peers fails on the shape instead of reading rows as a status.
    raw = np.zeros(max(2 * _STATUS_BYTES, 1 << (per * width - 1).bit_length()), np.uint8)
    raw[:len(local) * width] = local.reshape(-1).view(np.uint8)
    stacked = np.asarray(multihost_utils.process_allgather(raw))
    rows = np.concatenate([stacked[i, :n * width] for i, n in enumerate(sizes)])
    return rows.view(local.dtype).reshape(total, *row_shape)


def split_map(fn: Callable[[int, int], T], total: int, *, what: str = "rows") -> T:
    """``fn(0, total)`` computed as one slice per process and gathered on every process.

    Args:
      fn: ``(start, stop) -> result`` for rows ``[start, stop)``: an array, or a dict /
        tuple of arrays, each with ``stop - start`` leading rows; the same dtypes and
        trailing shapes on every process. It must not run collectives itself (params
        process-local, see :func:`localize`).
      total: the number of rows.
      what: names the work in log lines and errors.

    Returns:
      Equal to ``fn(0, total)`` up to float reordering: every leaf ``[total, ...]``, rows
      in order, on every process.

    Raises:
      Whatever ``fn`` raised on this process, or, on the other processes, the same type
      with that process's message (:func:`agree`); ValueError: results of another shape.
    """
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
    """Whether every array of ``tree`` lives on this process's devices alone (numpy and
    other non-JAX leaves count as local); a local model runs without collectives."""
    return all(not isinstance(x, jax.Array) or x.is_fully_addressable
               for x in jax.tree.leaves(tree))


@functools.lru_cache(maxsize=8)
def _local_mesh(mesh: Mesh, process: int) -> Mesh:
    devices = np.asarray(mesh.devices)
    mine = np.vectorize(lambda d: d.process_index == process)(devices)
    coords = [np.unique(ix) for ix in np.nonzero(mine)]
    block = devices[np.ix_(*coords)]
    if block.size != int(mine.sum()) or not all(d.process_index == process
                                                for d in block.flat):
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
    """``tree``'s arrays as arrays of this process's devices alone, without copying data.

    Params restored onto a mesh of all processes' devices are global arrays: a jitted
    call on them is a collective, which per-process slices of different shapes cannot
    make. When every mesh axis that splits an array lies inside one process (e.g. params
    replicated over ``data``, and ``model`` within a host), this process already holds a
    whole copy in its shards; they are re-wrapped on the process's block of the mesh
    with the same partition spec.

    Args:
      tree: a pytree; leaves that are not global ``jax.Array`` are returned as they are.

    Returns:
      The same structure, every array fully addressable (a no-op in a single process).

    Raises:
      ValueError: an array split across processes (a ``model`` axis spanning hosts): this
        process does not hold all of it.
    """
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
    """``encoder.encode(texts, **kwargs)``, each process encoding its slice of ``texts``.

    Args:
      encoder: an ``embedding_core.inference.Encoder``. When its ``params`` are global
        (the training loop's sharded params), the texts are not split: every process
        encodes all of them in step, as a jitted call on global arrays requires.
      texts: the same list on every process; checked whole first
        (``embedding_core.inference.check_texts``), so an empty text is reported with
        its index in ``texts`` by every process.
      **kwargs: passed to ``encoder.encode`` (``kind``, ``side``, ``normalize``, ...).

    Returns:
      ``[len(texts), dim]`` float32 on every process, row i = ``texts[i]``.
    """
    from embedding_core.inference import check_texts

    texts = check_texts(texts)
    if not is_local(getattr(encoder, "params", None)):
        return encoder.encode(texts, **kwargs)
    return split_map(lambda a, b: encoder.encode(texts[a:b], **kwargs), len(texts),
                     what="encode")
