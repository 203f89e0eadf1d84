"""Train state, optimizer, the sharded train-step factory and the one training loop.

Every model package supplies only (a) a parameter initialiser, (b) a loss function
``loss_fn(params, batch, rng) -> (loss, metrics)`` written on the global batch, and (c) a
batch iterator factory ``make_batches(start_step) -> Iterator[dict]``. Everything else —
sharded state creation, ``jax.jit`` with in/out shardings and donation, metrics, progress,
evaluation hooks, checkpoints and pre-emption — lives here, once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from flax.training import train_state
from jax.sharding import Mesh

from embedding_core import checkpoints, metric_log, parallel, run_control, storage, table_update
from embedding_core.run_lock import WorkdirLock

LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]


class TrainState(train_state.TrainState):
    """flax's TrainState; ``apply_fn`` is unused (losses close over their modules).

    ``first_nonfinite_step``: int32 scalar on device, -1 while every loss, gradient norm and
    updated parameter was finite, else the first step (1-based, as checkpoints count) where
    one was not. The
    train step sets it without a host sync; the loop reads it only before a save or an
    evaluation, and a set flag stops the run instead of writing a checkpoint. It is not
    saved (a saved state is finite by construction), so checkpoints keep their layout;
    ``None`` switches the tracking off.
    """

    first_nonfinite_step: Any = None


# ----------------------------------------------------------------------------- optimizer


def check_workdir(workdir: str | os.PathLike) -> epath.Path:
    """``workdir`` (a local folder or a ``gs://`` URI) as a path, refused early when it
    names an existing file.

    Raises:
      NotADirectoryError: ``workdir`` exists and is not a folder.
      ValueError: not a local path or ``gs://`` URI (see ``storage.as_path``).
    """
    path = storage.as_path(workdir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"--workdir {path} exists and is not a folder")
    return path


def learning_rate_schedule(
    peak: float, total_steps: int, warmup_steps: int, decay: str = "linear"
) -> optax.Schedule:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then linear or cosine decay to 0.

    The linear form is Hugging Face's ``get_linear_schedule_with_warmup`` (what SimCSE and
    DualCSE train with).
    """
    warmup_steps = min(warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup_steps, 1)
    if decay == "linear":
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    elif decay == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    elif decay == "constant":
        after = optax.constant_schedule(peak)
    else:
        raise ValueError(f"unknown lr decay {decay!r}; use linear, cosine or constant")
    if warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after],
                                [warmup_steps])


def weight_decay_mask(params: Any) -> Any:
    """True for matrices (kernels, embeddings); False for biases and LayerNorm parameters.

    Same split as Hugging Face's ``no_decay = ["bias", "LayerNorm.weight"]``.
    """
    return jax.tree.map(lambda p: np.ndim(p) > 1, params)


def make_optimizer(
    *,
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    decay: str = "linear",
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    grad_clip_norm: float | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) with warm-up/decay.

    Returns:
      ``(optimizer, schedule)``; the schedule is returned for logging.
    """
    schedule = learning_rate_schedule(learning_rate, total_steps, warmup_steps, decay)
    chain = []
    if grad_clip_norm:
        chain.append(optax.clip_by_global_norm(grad_clip_norm))
    chain.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=weight_decay_mask))
    return optax.chain(*chain), schedule


# ----------------------------------------------------------------------------- state


def create_sharded_state(
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rng: jax.Array,
    *,
    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
    pretrained: Mapping[str, Any] | None = None,
) -> tuple[TrainState, Any]:
    """Builds the train state directly in its sharded layout.

    Args:
      init_params: ``rng -> params`` whose leaves are ``nn.LogicallyPartitioned`` boxes
        (``module.init(...)["params"]``).
      tx: the optimizer.
      mesh: the device mesh.
      rng: PRNG key for the random initialisation.
      pretrained: optional ``{param path: numpy tree}``; each subtree replaces the freshly
        initialised one at that path, e.g. ``{("encoder", "transformer"): minilm_params}``.
        Structures and shapes must match.

    Returns:
      ``(state, state_shardings)``; params in the state are plain (unboxed) arrays.

    Raises:
      ValueError: a pretrained subtree whose structure or shapes differ from the model's.
    """

    init_state = _state_initializer(init_params, tx)
    shardings = state_shardings(init_params, tx, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = jax.jit(lambda k: nn.unbox(init_state(k)), out_shardings=shardings)(rng)
    if pretrained:
        params = state.params
        for path, tree in pretrained.items():
            params = _replace_subtree(params, shardings.params, tuple(path), tree)
        state = state.replace(params=params)
    return state, shardings


def _state_initializer(init_params, tx):
    def init_state(key):
        params = init_params(key)
        return TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None, params=params,
                          tx=tx, opt_state=tx.init(params),
                          first_nonfinite_step=jnp.full((), -1, jnp.int32))

    return init_state


def state_shardings(
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
) -> Any:
    """Shardings of the train state (params and optimizer moments follow logical names)."""
    abstract = jax.eval_shape(_state_initializer(init_params, tx), jax.random.key(0))
    return parallel.logical_shardings(abstract, mesh, rules)


def params_shardings(
    init_params: Callable[[jax.Array], Any],
    mesh: Mesh,
    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
) -> Any:
    """Shardings of the params alone (from their logical names; nothing is initialised)."""
    return parallel.logical_shardings(jax.eval_shape(init_params, jax.random.key(0)), mesh,
                                      rules)


def restore_params(
    directory: str | os.PathLike,
    init_params: Callable[[jax.Array], Any],
    mesh: Mesh,
    *,
    step: int | None = None,
    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
    sizes: Mapping[str, int] | None = None,
) -> tuple[int, Any]:
    """Restores the params of checkpoint ``step`` (default: latest) onto ``mesh``.

    Only the checkpoint's ``params`` item is read: no optimizer is built and no Adam
    moments are loaded. ``init_params`` (``rng -> boxed params``) fixes the structure and
    the logical axis names, hence the shardings (``rules`` fitted to ``mesh`` with
    ``sizes``, ``parallel.fit_rules``); it is only traced, never run. Any mesh works,
    whatever mesh wrote the checkpoint: orbax reads each device's slice (a DocEnt entity
    table restored onto ``model=8`` holds an eighth of its rows per device).

    Returns:
      ``(step, params)`` with params as plain sharded ``jax.Array`` leaves.

    Raises:
      FileNotFoundError: no checkpoint (at ``step``) under ``directory``.
      checkpoints.IncompatibleCheckpointError: a checkpoint of an older layout.
    """
    boxed = jax.eval_shape(init_params, jax.random.key(0))
    shardings = parallel.logical_shardings(boxed, mesh, rules, sizes)
    abstract = nn.unbox(boxed)
    return checkpoints.restore_params(directory, checkpoints.abstract_like(abstract, shardings),
                                      step)


def _replace_subtree(params: Any, shardings: Any, path: tuple[str, ...], tree: Any) -> Any:
    name = "/".join(path)
    if not path:
        return _place_like(tree, params, shardings, name)
    if not isinstance(params, Mapping) or path[0] not in params:
        have = sorted(params) if isinstance(params, Mapping) else type(params).__name__
        raise ValueError(f"pretrained weights for {name!r}, but the model has {have} there")
    out = dict(params)
    out[path[0]] = _replace_subtree(params[path[0]], shardings[path[0]], path[1:], tree)
    return out


def _place_like(tree: Any, like: Any, shardings: Any, name: str) -> Any:
    want = jax.tree.structure(like)
    got = jax.tree.structure(tree)
    if want != got:
        raise ValueError(f"pretrained tree for {name!r} has structure {got}, model has {want}")

    def put(value, target, sharding):
        value = np.asarray(value, dtype=target.dtype)
        if value.shape != target.shape:
            raise ValueError(f"pretrained {name}: shape {value.shape} != model {target.shape}")
        return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])

    return jax.tree.map(put, tree, like, shardings)


# ----------------------------------------------------------------------------- step


def make_train_step(
    loss_fn: LossFn,
    state_shardings: Any,
    mesh: Mesh,
    *,
    schedule: optax.Schedule | None = None,
    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
    value_and_grad: Callable | None = None,
    fused_table: table_update.FusedTableUpdate | None = None,
) -> Callable[[TrainState, Mapping[str, jax.Array], jax.Array], tuple[TrainState, dict]]:
    """The pure train step, jitted with shardings and a donated state.

    ``loss_fn(params, batch, rng)`` sees the *global* batch; gradients are those of the
    global mean loss, XLA inserts the reductions. The per-step dropout key is
    ``fold_in(rng, state.step)``, so a resumed run draws the same masks. A non-finite
    loss, gradient norm or updated parameter sets ``state.first_nonfinite_step`` (when the
    state tracks it). ``value_and_grad`` (``(params, batch, rng) -> ((loss, metrics),
    grads)``) replaces ``jax.value_and_grad(loss_fn, has_aux=True)``: a chunked contrastive
    step or gradient accumulation (``embedding_core.contrastive.step_value_and_grad``).
    ``fused_table`` folds a softmax table's optimizer step into a blockwise pass
    (``embedding_core.table_update``): the loss stops the table's gradient and returns its
    ``table_update.SoftmaxTableStats`` under ``metrics[table_update.TABLE_STATS]``, which
    the step takes out of the metrics.

    Returns:
      ``step(state, batch, rng) -> (state, metrics)``; metrics are replicated scalars
      including ``loss``, ``grad_norm`` and ``learning_rate``.

    Raises:
      ValueError: the table of ``fused_table`` is not split by rows over ``model``; (at
        trace time) a loss that returns table statistics without ``fused_table`` (its
        table would not train) or none with it.
    """

    grad_fn = value_and_grad or jax.value_and_grad(loss_fn, has_aux=True)
    if fused_table is not None:
        fused_table.check_sharding(state_shardings.params)

    def step(state: TrainState, batch, rng):
        key = jax.random.fold_in(rng, state.step)
        (loss, metrics), grads = grad_fn(state.params, batch, key)
        metrics = dict(metrics)
        stats = metrics.pop(table_update.TABLE_STATS, None)
        if (stats is None) != (fused_table is None):
            raise ValueError("the loss returned softmax table statistics (its table's "
                             "gradient stopped) but the step has no fused table update"
                             if fused_table is None else "the fused table update needs the "
                             f"loss's {table_update.TABLE_STATS!r} metrics entry")
        metrics["loss"] = loss
        if fused_table is None:
            metrics["grad_norm"] = optax.tree.norm(grads)
            new_state = state.apply_gradients(grads=grads)
        else:
            new_state, metrics["grad_norm"] = fused_table.apply_gradients(state, grads, stats,
                                                                          mesh)
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        flag = state.first_nonfinite_step
        if flag is not None:
            # The new params are checked too: an overflowing update (a huge learning rate)
            # turns them inf while this step's loss and gradient are still finite, and a
            # save would keep them. One fused reduction, no host sync.
            finite = jnp.isfinite(loss) & jnp.isfinite(metrics["grad_norm"])
            for leaf in jax.tree.leaves(new_state.params):
                finite &= jnp.all(jnp.isfinite(leaf))
            new_state = new_state.replace(first_nonfinite_step=jnp.where(
                (flag < 0) & ~finite, (state.step + 1).astype(flag.dtype), flag))
        return new_state, metrics

    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, parallel.batch_sharding(mesh), parallel.replicated(mesh)),
        out_shardings=(state_shardings, parallel.replicated(mesh)),
        donate_argnums=0,
    )

    def run(state, batch, rng):
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            return jitted(state, batch, rng)

    run.jitted = jitted  # for ahead-of-time lowering in benchmarks
    return run


# ----------------------------------------------------------------------------- loop


def _progress_bar(total: int, initial: int):
    if jax.process_index() != 0:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                desc="train", smoothing=0.1)


def train_loop(
    *,
    workdir: str | os.PathLike,
    state: TrainState,
    state_shardings: Any,
    train_step: Callable,
    make_batches: Callable[[int], Iterator[Mapping[str, np.ndarray]]],
    mesh: Mesh,
    num_train_steps: int,
    rng: jax.Array,
    seed: int,
    global_batch_size: int,
    log_every: int = 50,
    checkpoint_every: int = 500,
    keep_checkpoints: int = 3,
    eval_every: int = 0,
    eval_fn: Callable[[TrainState, int], Mapping[str, float]] | None = None,
    hparams: Mapping[str, Any] | None = None,
    stop_after: int | None = None,
    stops: run_control.StopSignals | None = None,
    lock: WorkdirLock | None = None,
) -> TrainState:
    """Runs (or resumes) training to ``num_train_steps``.

    Resumption: when ``workdir/checkpoints`` holds a checkpoint, the state is restored onto
    ``state_shardings`` and the batches restart at the saved data position. Checkpoints are
    written every ``checkpoint_every`` steps, on SIGTERM / Ctrl-C and at the end; the loop
    waits for pending asynchronous saves before it returns or raises (no truncated last
    checkpoint). Metrics go to TensorBoard scalars and ``metrics.jsonl`` in ``workdir`` and to
    the log, and ``workdir/plots/training.png`` is drawn when the loop ends
    (``embedding_core.metric_log``); a tqdm bar with ETA shows progress on process 0.

    Never lost, never corrupted (``docs/architecture.md``, "Stopping a run"): before each
    save and evaluation the state's ``first_nonfinite_step`` is read, and a diverged state
    raises instead of being saved, so the latest checkpoint stays the last finite one
    (orbax's ``max_to_keep`` deletes old checkpoints only when a new one is saved).

    Args:
      make_batches: ``start_step -> iterator`` of this process's host batches (numpy,
        leading dimension ``global_batch_size / process_count``); a ``"step"`` entry, when
        present, is checked against the loop's step.
      eval_fn: ``(state, step) -> {name: float}``, called every ``eval_every`` steps and at
        the end when ``eval_every > 0``.
      stop_after: stop (with a checkpoint) after this many steps of *this* invocation;
        for tests of resumption.
      stops: the signal handlers to read (``run`` installs them before the lock is taken);
        default: installed here for the loop.
      lock: the workdir lock, checked (no I/O) before every step.

    Returns:
      The final state.

    Raises:
      run_control.DivergedError: a non-finite loss, gradient norm, parameter or logged
        metric.
      run_control.Preempted: SIGTERM, after saving (exit code 75 in the CLI).
      run_control.Interrupted: Ctrl-C, after saving (a ``KeyboardInterrupt``; exit 130).
      run_control.Aborted: a second Ctrl-C, at once (names the latest complete checkpoint).
      run_control.WorkdirInUseError: another run took the workdir's lock over.
    """
    workdir = storage.as_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    manager = checkpoints.make_manager(workdir / "checkpoints", max_to_keep=keep_checkpoints)
    start_step = 0
    fresh_flag = state.first_nonfinite_step
    restored = checkpoints.restore(manager,
                                          checkpoints.abstract_like(state, state_shardings))
    if restored is not None:
        _, state, position = restored
        # The flag is not in the checkpoint: a restored state starts finite.
        state = state.replace(first_nonfinite_step=fresh_flag)
        start_step = checkpoints.check_data_position(
            position, seed=seed, global_batch_size=global_batch_size, directory=workdir)
        logging.info("resuming at step %d", start_step)

    # Events, metrics.jsonl and the plot of a gs:// workdir are written locally and uploaded
    # with each checkpoint and at the end (TensorBoard's writer needs local files).
    writer = metric_log.MetricLog(workdir, start_step=start_step,
                                  active=jax.process_index() == 0)
    if hparams and start_step == 0:
        writer.write_hparams(hparams)

    def position(next_step: int) -> dict:
        return {"next_step": next_step, "seed": seed, "global_batch_size": global_batch_size}

    last_saved = start_step if restored is not None else -1
    where = workdir / "checkpoints"

    def check_finite(state: TrainState, bad_metrics: Mapping[str, float] | None = None):
        flag = state.first_nonfinite_step
        first = -1 if flag is None else int(jax.device_get(flag))
        if first < 0 and not bad_metrics:
            return
        latest = (f"the latest checkpoint, step {last_saved} in {where}, holds finite values "
                  "(evaluate and export read it)" if last_saved >= 0
                  else "no checkpoint was written")
        if first >= 0:
            what = (f"the loss, gradient norm or parameters became non-finite at step "
                    f"{first}")
        else:
            what = f"non-finite training metrics {dict(bad_metrics)} at step {step}"
        raise run_control.DivergedError(
            f"training diverged: {what}; nothing from it is saved and {latest}. The same "
            "settings diverge again: train into a new --workdir with a lower "
            "--config.learning_rate (or more warmup_steps, a grad_clip_norm), or check the data")

    def save(state: TrainState) -> None:
        nonlocal last_saved
        check_finite(state)
        checkpoints.save(manager, step, state, position(step))
        last_saved = step
        writer.sync()

    step = start_step
    batches = make_batches(start_step)
    pending: list[dict] = []
    window_start = time.perf_counter()
    own_stops = stops is None
    if own_stops:
        stops = run_control.StopSignals(multiprocess=jax.process_count() > 1)
    try:
        try:
            with (stops if own_stops else contextlib.nullcontext(stops)), \
                    _progress_bar(num_train_steps, start_step) as bar:
                while step < num_train_steps and not stops.requested:
                    if lock is not None:
                        lock.check()
                    host_batch = dict(next(batches))
                    batch_step = host_batch.pop("step", None)
                    if batch_step is not None and int(batch_step) != step:
                        raise RuntimeError(f"data position {int(batch_step)} != train step {step}")
                    batch = parallel.host_to_global(host_batch, mesh)
                    state, metrics = train_step(state, batch, rng)
                    pending.append(metrics)
                    step += 1
                    if bar is not None:
                        bar.update(1)
                    if step % log_every == 0 or step == num_train_steps:
                        summary = _mean_metrics(pending)
                        elapsed = time.perf_counter() - window_start
                        summary["steps_per_sec"] = len(pending) / max(elapsed, 1e-9)
                        summary["examples_per_sec"] = summary["steps_per_sec"] * global_batch_size
                        bad = {k: v for k, v in summary.items() if not math.isfinite(v)}
                        if bad:
                            check_finite(state, bad)
                        writer.write(step, summary)
                        if bar is not None:
                            bar.set_postfix(loss=f"{summary['loss']:.4f}")
                        pending.clear()
                        window_start = time.perf_counter()
                    if eval_fn is not None and eval_every and (
                            step % eval_every == 0 or step == num_train_steps):
                        check_finite(state)
                        writer.write(step, eval_fn(state, step), metric_log.EVAL)
                        window_start = time.perf_counter()
                    stop_now = stops.should_stop(step) or (
                        stop_after is not None and step - start_step >= stop_after)
                    if step % checkpoint_every == 0 or step == num_train_steps or stop_now:
                        save(state)
                    if stop_now:
                        break
                if last_saved != step and step > start_step:
                    save(state)
        finally:
            manager.wait_until_finished()
            manager.close()
            writer.close()
    except KeyboardInterrupt as err:
        if isinstance(err, run_control.Interrupted):
            raise
        # A second Ctrl-C (or the first, in a multi-process run): the step or the save in
        # flight is lost; a rerun resumes from the latest complete checkpoint.
        raise run_control.Aborted(_aborted(step, where)) from None
    if stops.requested:
        raise stops.stopped(last_saved, str(where))
    return state


def _aborted(step: int, where: epath.Path) -> str:
    steps = ocp.utils.checkpoint_steps(where) if where.is_dir() else []
    kept = (f"the latest complete checkpoint is step {max(steps)} in {where}; run the same "
            "command to resume from it" if steps
            else "no checkpoint was kept; run the same command to start again")
    return f"aborted (second Ctrl-C) at step {step}, the step or save in flight lost: {kept}"


def _mean_metrics(pending: list[dict]) -> dict[str, float]:
    fetched = jax.device_get(pending)
    return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
