"""The one training loop: resume, steps, metrics, evaluation, checkpoints and stops
(``docs/architecture.md``, "Stopping a run")."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh

from embedding_core.distributed import multihost, parallel
from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object, write_json
from embedding_core.training import checkpoints, metric_log, run_control
from embedding_core.training.run_lock import WorkdirLock
from embedding_core.training.training import TrainState

EvalFn = Callable[[TrainState, int], Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """How long the loop runs and how often it logs, evaluates and saves; ``seed`` and
    ``global_batch_size`` identify the data order; ``stop_after``: steps of this call."""

    num_train_steps: int
    seed: int
    global_batch_size: int
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    eval_every: int = 0
    stop_after: int | None = None
    select_metric: str = ""

    @classmethod
    def from_config(cls, config: Any, num_train_steps: int, global_batch_size: int,
                    stop_after: int | None = None) -> LoopSettings:
        return cls(num_train_steps=num_train_steps, seed=int(config.seed),
                   global_batch_size=global_batch_size, log_every=int(config.log_every),
                   checkpoint_every=int(config.checkpoint_every),
                   keep_checkpoints=int(config.keep_checkpoints),
                   eval_every=int(config.eval_every), stop_after=stop_after,
                   select_metric=str(config.select_metric))

    def position(self, next_step: int) -> dict:
        """The data position saved with the checkpoint of ``next_step``."""
        return {"next_step": next_step, "seed": self.seed,
                "global_batch_size": self.global_batch_size}


def train_loop(*, workdir: str | os.PathLike, state: TrainState, state_shardings: Any,
               train_step: Callable, mesh: Mesh, rng: jax.Array, settings: LoopSettings,
               make_batches: Callable[[int], Iterator[Mapping[str, np.ndarray]]],
               eval_fn: EvalFn | None = None, hparams: Mapping[str, Any] | None = None,
               stops: run_control.StopSignals | None = None,
               lock: WorkdirLock | None = None,
               compile_step: Callable | None = None) -> TrainState:
    """Trains (or resumes) to ``num_train_steps``, saving every ``checkpoint_every`` steps,
    on a stop and at the end, never a non-finite state; ``make_batches(start_step)``:
    this process's host batches; ``compile_step`` compiles before the first barrier.
    Raises: run_control's DivergedError, Preempted, Interrupted, Aborted, WorkdirInUseError.
    """
    workdir = storage.as_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    loop = _Loop(workdir, settings, train_step, mesh, rng, eval_fn, lock)
    state = loop.restore(state, state_shardings)
    loop.writer = metric_log.MetricLog(workdir, start_step=loop.start_step,
                                       active=jax.process_index() == 0)
    if hparams and loop.start_step == 0:
        loop.writer.write_hparams(hparams)
    batches = make_batches(loop.start_step)
    own_stops = stops is None
    if own_stops:
        stops = run_control.StopSignals(multiprocess=jax.process_count() > 1)
    loop.stops = stops
    try:
        try:
            with stops if own_stops else contextlib.nullcontext(stops):
                batches = loop.ready(state, batches, compile_step)
                with _progress_bar(settings.num_train_steps, loop.start_step) as bar:
                    state = loop.run(state, batches, bar)
        finally:
            loop.close()
    except KeyboardInterrupt as err:
        if isinstance(err, run_control.Interrupted):
            raise
        # A second Ctrl-C (or the first, multi-process): the step or save in flight is lost.
        raise run_control.Aborted(_aborted(loop.step, loop.where)) from None
    if stops.requested:
        raise stops.stopped(loop.last_saved, str(loop.where))
    return state


class _Loop:
    """One invocation of :func:`train_loop`: its position, checkpoints and metric log."""

    def __init__(self, workdir: epath.Path, settings: LoopSettings, train_step: Callable,
                 mesh: Mesh, rng: jax.Array, eval_fn: EvalFn | None,
                 lock: WorkdirLock | None) -> None:
        self.workdir, self.settings, self.train_step = workdir, settings, train_step
        self.mesh, self.rng, self.eval_fn, self.lock = mesh, rng, eval_fn, lock
        self.where = workdir / "checkpoints"
        self.manager = checkpoints.make_manager(self.where, max_to_keep=settings.keep_checkpoints,
                                                select_metric=settings.select_metric)
        self.step = self.start_step = 0
        self.last_saved = -1
        self.in_flight: int | None = None  # the step of an async save not yet complete
        self.write_failed = False
        self.writer: metric_log.MetricLog | None = None
        self.stops: run_control.StopSignals | None = None
        self.pending: list[dict] = []
        self.window_start = time.perf_counter()

    def restore(self, state: TrainState, shardings: Any) -> TrainState:
        """The latest checkpoint's state (or ``state``), and the step to start from."""
        fresh_flag = state.first_nonfinite_step
        restored = checkpoints.restore(self.manager, checkpoints.abstract_like(state, shardings))
        if restored is not None:
            _, state, position = restored
            # The flag is not in the checkpoint: a restored state starts finite.
            state = state.replace(first_nonfinite_step=fresh_flag)
            self.start_step = checkpoints.check_data_position(
                position, seed=self.settings.seed,
                global_batch_size=self.settings.global_batch_size, directory=self.workdir)
            self.last_saved = self.start_step
            if self.start_step >= self.settings.num_train_steps:
                logging.info("training already finished at step %d", self.start_step)
            else:
                logging.info("resuming at step %d", self.start_step)
        self.step = self.start_step
        return state

    def ready(self, state: TrainState, batches: Iterator,
              compile_step: Callable | None) -> Iterator:
        """``batches`` after compiling the step on the first and waiting for every process
        (a host compiling minutes later would fail the others' first collective)."""
        # A stop asked for alone skips the compile; several processes all pass the barrier.
        if self.step >= self.settings.num_train_steps or (
                self.stops.requested and not self.stops.multiprocess):
            return batches
        first = next(batches)
        logging.info("compiling the train step (the first step only) ...")
        if compile_step is not None:
            batch = {k: v for k, v in first.items() if k != "step"}
            compile_step(state, parallel.host_to_global(batch, self.mesh), self.rng)
        multihost.barrier("first train step")
        return itertools.chain([first], batches)

    def run(self, state: TrainState, batches: Iterator, bar) -> TrainState:
        s = self.settings
        self.window_start = time.perf_counter()
        while self.step < s.num_train_steps and not self.stops.requested:
            state = self._train_step(state, batches, bar)
            last = self.step == s.num_train_steps
            if self.step % s.log_every == 0 or last:
                self._log(state, bar)
            if self.eval_fn is not None and s.eval_every and (
                    self.step % s.eval_every == 0 or last):
                self.check_finite(state)
                results = self.eval_fn(state, self.step)
                self.writer.write(self.step, results, metric_log.EVAL)
                if s.select_metric:
                    self.select(state, results)
                self.window_start = time.perf_counter()
            stop_now = self.stops.should_stop(self.step) or (
                s.stop_after is not None and self.step - self.start_step >= s.stop_after)
            if (self.step % s.checkpoint_every == 0 or last or stop_now) \
                    and self.last_saved != self.step:
                self.save(state)
            if stop_now:
                break
        if self.last_saved != self.step and self.step > self.start_step:
            self.save(state)
        return state

    def _train_step(self, state: TrainState, batches: Iterator, bar) -> TrainState:
        if self.lock is not None:
            self.lock.check()
        host_batch = dict(next(batches))
        batch_step = host_batch.pop("step", None)
        if batch_step is not None and int(batch_step) != self.step:
            raise RuntimeError(f"data position {int(batch_step)} != train step {self.step}")
        batch = parallel.host_to_global(host_batch, self.mesh)
        state, metrics = self.train_step(state, batch, self.rng)
        self.pending.append(metrics)
        self.step += 1
        if bar is not None:
            bar.update(1)
        return state

    def _log(self, state: TrainState, bar) -> None:
        summary = _mean_metrics(self.pending)
        elapsed = time.perf_counter() - self.window_start
        summary["steps_per_sec"] = len(self.pending) / max(elapsed, 1e-9)
        summary["examples_per_sec"] = summary["steps_per_sec"] * self.settings.global_batch_size
        bad = {k: v for k, v in summary.items() if not math.isfinite(v)}
        if bad:
            self.check_finite(state, bad)
        self.writer.write(self.step, summary)
        if bar is not None:
            bar.set_postfix(loss=f"{summary['loss']:.4f}")
        self.pending.clear()
        self.window_start = time.perf_counter()

    def check_finite(self, state: TrainState,
                     bad_metrics: Mapping[str, float] | None = None) -> None:
        """Raises ``DivergedError`` when the state's flag or a logged metric is not finite."""
        flag = state.first_nonfinite_step
        first = -1 if flag is None else int(jax.device_get(flag))
        if first < 0 and not bad_metrics:
            return
        latest = (f"the latest checkpoint, step {self.last_saved} in {self.where}, holds "
                  "finite values (evaluate and export read it)" if self.last_saved >= 0
                  else "no checkpoint was written")
        if first >= 0:
            what = f"the loss, gradient norm or parameters became non-finite at step {first}"
        else:
            what = f"non-finite training metrics {dict(bad_metrics)} at step {self.step}"
        raise run_control.DivergedError(
            f"training diverged: {what}; nothing from it is saved and {latest}. The same "
            "settings diverge again: train into a new --workdir with a lower "
            "--config.learning_rate (or more warmup_steps, a grad_clip_norm), or check the data")

    def select(self, state: TrainState, results: Mapping[str, float]) -> None:
        """Saves this step ranked by ``select_metric``, in ``BEST_FILE`` when the best."""
        name = self.settings.select_metric
        if name not in results:
            self.save(state)  # the steps trained so far are kept: fix the name and resume
            raise ValueError(f"config.select_metric={name!r} is not among this run's eval "
                             f"metrics: {sorted(results)}; the checkpoint of step "
                             f"{self.step} is saved")
        value = float(results[name])
        self.save(state, metrics={name: value})
        best_file = self.workdir / checkpoints.BEST_FILE
        best = read_json_object(best_file) if best_file.is_file() else {}
        if jax.process_index() == 0 and (best.get("metric") != name
                                         or value > float(best.get("value", -math.inf))):
            write_json(best_file, {"metric": name, "value": value, "step": self.step})

    def save(self, state: TrainState, metrics: Mapping[str, float] | None = None) -> None:
        self.check_finite(state)
        try:
            checkpoints.wait(self.manager, self.in_flight)  # its failure names its step
            self.in_flight = self.step
            checkpoints.save(self.manager, self.step, state, self.settings.position(self.step),
                             metrics=dict(metrics) if metrics else None)
        except checkpoints.CheckpointWriteError:
            self.write_failed = True
            raise
        self.last_saved = self.step
        self.writer.sync()

    def close(self) -> None:
        try:
            if not self.write_failed:  # orbax raises a failed write again on every wait
                checkpoints.wait(self.manager, self.in_flight)
                self.manager.close()
        except checkpoints.CheckpointWriteError:
            self.write_failed = True
            raise
        finally:
            # After a failed write, the write's error is the one to report.
            with contextlib.suppress(Exception) if self.write_failed else \
                    contextlib.nullcontext():
                self.writer.close()


def _progress_bar(total: int, initial: int):
    if jax.process_index() != 0:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                desc="train", smoothing=0.1)


def _aborted(step: int, where: epath.Path) -> str:
    steps = ocp.utils.checkpoint_steps(where) if where.is_dir() else []
    kept = (f"the latest complete checkpoint is step {max(steps)} in {where}; run the same "
            "command to resume from it" if steps
            else "no checkpoint was kept; run the same command to start again")
    return f"aborted (second Ctrl-C) at step {step}, the step or save in flight lost: {kept}"


def _mean_metrics(pending: list[dict]) -> dict[str, float]:
    fetched = jax.device_get(pending)
    return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
