"""Orbax checkpoints of items ``params``, ``opt_state`` (with the step) and ``data`` (the
data position: next step, seed, global batch size), restored onto target shardings
(``docs/architecture.md``, "Checkpoints").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from embedding_core.errors import StorageError
from embedding_core.storage import storage

ITEMS = ("params", "opt_state", "data")


class CheckpointMismatchError(ValueError):
    """A checkpoint's data position does not belong to the current configuration."""


class IncompatibleCheckpointError(ValueError):
    """A checkpoint written by an older version of the library (one ``state`` item)."""


BEST_FILE = "best_checkpoint.json"  # beside checkpoints/: {"metric", "value", "step"}


def make_manager(directory: str | os.PathLike, *, max_to_keep: int = 3,
                 async_save: bool = True, select_metric: str = "") -> ocp.CheckpointManager:
    """An ``ocp.CheckpointManager`` of :data:`ITEMS` keeping the ``max_to_keep`` newest and
    the best by ``select_metric`` (``save(..., metrics=)``)."""
    from orbax.checkpoint.checkpoint_managers import preservation_policy as policy

    directory = _directory(directory)
    keep: dict[str, Any] = {"max_to_keep": max_to_keep}
    if select_metric:
        best = lambda m: m[select_metric]  # noqa: E731
        # best_fn also makes orbax keep the metrics: the best survives a resume.
        keep = {"best_fn": best, "best_mode": "max",
                "preservation_policy": policy.AnyPreservationPolicy([
                    policy.LatestN(n=max_to_keep),
                    policy.BestN(get_metric_fn=best, n=1,
                                 keep_checkpoints_without_metrics=False)])}
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=async_save,
                                           **keep)
    return ocp.CheckpointManager(directory, options=options, item_names=ITEMS)


def _directory(directory: str | os.PathLike) -> epath.Path:
    path = storage.as_path(directory)
    return path if storage.is_remote(path) else path.resolve()


class CheckpointWriteError(StorageError):
    """One line: the folder, the storage error and the checkpoint a rerun resumes from."""


def save(manager: ocp.CheckpointManager, step: int, state: Any, data_position: dict,
         *, force: bool = True, metrics: dict[str, float] | None = None) -> bool:
    """Saves params, opt_state (with the step) and ``data_position``; :func:`wait` for an
    async save in flight first. Raises CheckpointWriteError."""
    with _writing(manager, step):
        return manager.save(step, force=force, metrics=metrics, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state}),
            data=ocp.args.JsonSave(data_position)))


def wait(manager: ocp.CheckpointManager, step: int | None) -> None:
    """Blocks until the async save of ``step`` is complete. Raises CheckpointWriteError."""
    with _writing(manager, step):
        manager.wait_until_finished()


@contextlib.contextmanager
def _writing(manager: ocp.CheckpointManager, step: int | None) -> Iterator[None]:
    # orbax's tracebacks of a failed write run to screens: one line.
    try:
        yield
    except (CheckpointWriteError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - re-raised with the folder named
        folder = storage.as_path(manager.directory) / ("?" if step is None else str(step))
        try:
            kept = [s for s in ocp.utils.checkpoint_steps(manager.directory) if s != step]
        except Exception:  # noqa: BLE001 - the storage that failed may fail this too
            kept = []
        then = (f"step {max(kept)} in {manager.directory} is the latest complete checkpoint: "
                "the same command resumes from it" if kept else
                "no earlier checkpoint is kept: the same command starts again")
        _quiet_orphaned_writes(str(folder))
        raise CheckpointWriteError(f"{folder}: checkpoint write failed: "
                                   f"{storage_error(err)}; {then}") from err


class _OrphanedWriteFilter(logging.Filter):
    """Drops asyncio's "exception was never retrieved" records of a folder whose failure
    was raised already (orbax's other array writes, logged when collected)."""

    def __init__(self) -> None:
        super().__init__()
        self.folders: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        return not (err is not None and str(record.msg).split("\n", 1)[0].endswith(
            "exception was never retrieved")  # a Task's, or a Future's (tensorstore's)
            and any(folder + "/" in str(err) for folder in self.folders))


_ORPHANED = _OrphanedWriteFilter()


def _quiet_orphaned_writes(folder: str) -> None:
    _ORPHANED.folders.add(folder)
    asyncio_log = logging.getLogger("asyncio")
    if _ORPHANED not in asyncio_log.filters:
        asyncio_log.addFilter(_ORPHANED)


def storage_error(err: BaseException) -> str:
    """The innermost reason on one line of at most 300 characters (tensorstore's
    ``CODE: Error writing X ...: Error reading Y: REASON [spec...]`` as ``CODE: Y: REASON``)."""
    text = " ".join(storage.describe_error(err).split()) or type(err).__name__
    parts = re.split(r"Error (?:reading|writing|opening) ", text)
    if len(parts) > 1:
        code = re.match(r"([A-Z][A-Z_]{3,}): ", text)
        text = (code[0] if code else "") + parts[-1].split(" [", 1)[0]
    return text if len(text) <= 300 else text[:297] + "..."


def best_step(directory: str | os.PathLike, steps: list[int]) -> int | None:
    """The step :data:`BEST_FILE` beside ``directory`` names, when it is among ``steps``."""
    path = storage.as_path(directory).parent / BEST_FILE
    if not path.is_file():
        return None
    from embedding_core.storage.files import read_json_object

    step = read_json_object(path).get("step")
    if step in steps:
        return int(step)
    logging.warning("%s names step %s, which is not among the checkpoints %s: using the "
                    "newest", path, step, steps)
    return None


def abstract_like(tree: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct`` tree with the target shardings."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def check_layout(directory: str | os.PathLike) -> None:
    """Raises IncompatibleCheckpointError: a step folder of the older ``state`` layout."""
    directory = storage.as_path(directory)
    if not directory.is_dir():
        return
    for folder in sorted(directory.iterdir(), key=lambda p: p.name):
        if folder.name.isdigit():
            _check_folder(folder)


def _check_layout(manager: ocp.CheckpointManager, step: int) -> None:
    _check_folder(storage.as_path(manager.directory) / str(step))


class DamagedCheckpointError(ValueError):
    """A checkpoint folder that orbax cannot read (files missing or cut short)."""


@contextlib.contextmanager
def _readable(manager: ocp.CheckpointManager, step: int) -> Iterator[None]:
    # orbax's errors for a damaged folder run to screens: name the folder, cause, way out.
    try:
        yield
    except (IncompatibleCheckpointError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - re-raised with the folder named
        first = (str(err).strip().splitlines() or [""])[0][:200]
        others = [s for s in manager.all_steps() if s != step]
        folder = storage.as_path(manager.directory) / str(step)
        raise DamagedCheckpointError(
            f"{folder}: checkpoint cannot be read into this "
            f"model ({type(err).__name__}: {first}). It is damaged or was written for other "
            f"settings; {'try --step=' + str(max(others)) if others else 'retrain'}") from err


def _check_folder(folder: epath.Path) -> None:
    if (folder / "state").exists() and not (folder / "params").exists():
        raise IncompatibleCheckpointError(
            f"{folder} was written by an older embedding-jax (one 'state' item); this version "
            "keeps params and optimizer state apart. Retrain into a new --workdir (or use the "
            "older version to export the embeddings).")


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None
            ) -> tuple[int, Any, dict] | None:
    """``(step, state, data_position)`` of ``step`` (default: the newest), or ``None``.
    Raises: IncompatibleCheckpointError, DamagedCheckpointError."""
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    _check_layout(manager, step)
    with _readable(manager, step):
        restored = manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_state.params),
            opt_state=ocp.args.StandardRestore(
                {"step": abstract_state.step, "opt_state": abstract_state.opt_state}),
            data=ocp.args.JsonRestore()))
    logging.info("restored checkpoint step %d from %s", step, manager.directory)
    opt = restored["opt_state"]
    state = abstract_state.replace(params=restored["params"], step=opt["step"],
                                   opt_state=opt["opt_state"])
    return step, state, dict(restored["data"])


def restore_params(directory: str | os.PathLike, abstract_params: Any,
                   step: int | None = None) -> tuple[int, Any]:
    """``(step, params)`` of ``step`` (default: :func:`best_step`, else the newest).
    Raises: FileNotFoundError; IncompatibleCheckpointError, DamagedCheckpointError."""
    if not storage.as_path(directory).is_dir():
        raise FileNotFoundError(f"{directory} holds no checkpoint; train first")
    manager = make_manager(directory, async_save=False)
    try:
        steps = manager.all_steps()
        if not steps:
            raise FileNotFoundError(f"{directory} holds no checkpoint; train first")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"{directory}: no checkpoint at step {step}; have {steps}")
        if step is None:
            step = best_step(directory, steps) or max(steps)
        _check_layout(manager, step)
        with _readable(manager, step):
            restored = manager.restore(
                step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)))
    finally:
        manager.close()
    return step, restored["params"]


def check_data_position(position: dict, *, seed: int, global_batch_size: int,
                        directory: str | os.PathLike) -> int:
    """The next step. Raises CheckpointMismatchError: seed or batch size changed."""
    for key, want in (("seed", seed), ("global_batch_size", global_batch_size)):
        if position.get(key) != want:
            raise CheckpointMismatchError(
                f"{directory}: checkpoint was written with {key}={position.get(key)}, "
                f"the config asks for {key}={want}; use a new --workdir or the old value")
    return int(position["next_step"])
