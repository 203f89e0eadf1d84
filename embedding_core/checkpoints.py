"""Orbax checkpoints of the train state plus the data position.

A checkpoint holds two items: ``state`` (the sharded ``TrainState`` pytree) and ``data``
(JSON: the next step to run, the data seed and the global batch size). The input pipeline
is a pure function of (seed, step), so restoring ``data.next_step`` continues the exact
order of an uninterrupted run. Restores are given target shardings, so a checkpoint
written on one mesh restores onto another (PITFALLS: no silent replication).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
    """A checkpoint's data position does not belong to the current configuration."""


def make_manager(
    directory: str | os.PathLike,
    *,
    max_to_keep: int = 3,
    async_save: bool = True,
) -> ocp.CheckpointManager:
    """An ``ocp.CheckpointManager`` for ``{state, data}`` items under ``directory``.

    Saves are asynchronous: device arrays are copied to host before ``save`` returns (so
    donated buffers may be reused right after), files are written in the background.
    Unfinished saves are never listed as checkpoints (orbax commits by atomic rename).
    """
    directory = Path(directory).resolve()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        create=True,
        enable_async_checkpointing=async_save,
    )
    return ocp.CheckpointManager(directory, options=options, item_names=("state", "data"))


def save(manager: ocp.CheckpointManager, step: int, state: Any, data_position: dict,
         *, force: bool = True) -> bool:
    """Saves ``state`` and ``data_position`` (JSON-serialisable) as checkpoint ``step``."""
    return manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_position),
        ),
        force=force,
    )


def abstract_like(state: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct`` tree with the target shardings, for restoring onto a mesh."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )


def restore(
    manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None
) -> tuple[int, Any, dict] | None:
    """Restores checkpoint ``step`` (default: the newest) onto ``abstract_state``'s shardings.

    Args:
      abstract_state: ``ShapeDtypeStruct`` tree (see ``abstract_like``) giving the target
        structure, dtypes and shardings.

    Returns:
      ``(step, state, data_position)`` or ``None`` when the directory has no checkpoint.
    """
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
        ),
    )
    logging.info("restored checkpoint step %d from %s", step, manager.directory)
    return step, restored["state"], dict(restored["data"])


def check_data_position(position: dict, *, seed: int, global_batch_size: int,
                        directory: str | os.PathLike) -> int:
    """Validates a restored data position against the config; returns the next step.

    Raises:
      CheckpointMismatchError: when seed or batch size changed, since the resumed run would
        then silently see a different data order.
    """
    for key, want in (("seed", seed), ("global_batch_size", global_batch_size)):
        if position.get(key) != want:
            raise CheckpointMismatchError(
                f"{directory}: checkpoint was written with {key}={position.get(key)}, "
                f"the config asks for {key}={want}; use a new --workdir or the old value"
            )
    return int(position["next_step"])
