"""``run(make_task, config, workdir)``: the one way every model is trained.

The core owns everything that is not a model, a loss or a protocol: config checks before
anything compiles, multi-host start-up and the mesh, the sharded state (pretrained weights
placed in it), resume with the data position, the loop, periodic evaluation, checkpoints,
pre-emption and TensorBoard. A package's ``trainer.py`` only builds its :class:`Task`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import jax
import ml_collections
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from embedding_core import (
    checkpoints,
    configs,
    contrastive,
    parallel,
    run_control,
    run_lock,
    training,
)
from embedding_core.task import Task


def default_optimizer(config: ml_collections.ConfigDict, total_steps: int
                      ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with warm-up and decay from the shared fields of ``configs.base()``."""
    return training.make_optimizer(
        learning_rate=float(config.learning_rate), total_steps=max(int(total_steps), 1),
        warmup_steps=int(config.warmup_steps), weight_decay=float(config.weight_decay),
        decay=config.lr_decay, grad_clip_norm=float(config.grad_clip_norm) or None)


def run(
    make_task: Callable[[ml_collections.ConfigDict, Mesh], Task],
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    validate: Callable[[ml_collections.ConfigDict], None] | None = None,
    stop_after: int | None = None,
) -> training.TrainState:
    """Trains (or resumes) the task ``make_task(config, mesh)`` into ``workdir``.

    Order: shared and model config checks (``validate``), the workdir check (a saved
    config that differs in a non-resumable field is refused only when the workdir holds a
    checkpoint: with none there is nothing to resume and the new config replaces it), multi-host
    start-up and the mesh, the global batch against the data-parallel size (when the
    config has ``batch_size``), then the task (data and pretrained weights load here), the
    saved config and run files, the sharded state and the loop. Nothing compiles before
    the checks pass, and nothing is written before the task has loaded its data.

    Writes ``workdir/run_config.json``, the task's run files, TensorBoard events and orbax
    checkpoints under ``workdir/checkpoints`` (params, optimizer state and data position).
    While it trains, ``workdir/run.lock`` keeps a second run out (``run_lock``); SIGTERM
    and Ctrl-C save a checkpoint and stop (``run_control``), during start-up (before the
    lock) they stop at once; a diverged run stops without saving its non-finite state.

    Args:
      make_task: builds the task for this config on this mesh.
      validate: the package's config check (raises ``ValueError``).
      stop_after: stop with a checkpoint after this many steps of this call (tests).

    Returns:
      The final train state.

    Raises:
      ValueError: a bad config; NotADirectoryError: ``workdir`` is a file; whatever the
        task raises for bad data or missing models.
      run_control.WorkdirInUseError: another live run holds ``workdir``.
      run_control.DivergedError: a non-finite loss or gradient (nothing saved from it).
      run_control.Preempted / run_control.Interrupted: SIGTERM / Ctrl-C, after saving
        (or before the first step, with nothing to save).
      run_control.Aborted: a second Ctrl-C (names the latest complete checkpoint).
    """
    # SIGTERM / Ctrl-C from here on exit 75 / 130 (start-up: at once, nothing to save). A
    # multi-process run leaves them to JAX's preemption service, which jax.distributed
    # starts: decided from the config, since asking JAX would start its backend too early.
    distributed = bool(config.get("coordinator_address")
                       or os.environ.get("JAX_COORDINATOR_ADDRESS")
                       or jax.distributed.is_initialized())
    with run_control.StopSignals(multiprocess=distributed, immediate=True) as stops:
        configs.validate_base(config)
        if validate is not None:
            validate(config)
        workdir = training.check_workdir(workdir)
        checkpoints.check_layout(workdir / "checkpoints")
        _check_resume(config, workdir)
        mesh = parallel.mesh_from_config(config)
        if distributed and jax.process_count() == 1:
            stops.multiprocess = False
            stops.install()
        if "batch_size" in config:
            parallel.check_global_batch(int(config.batch_size), mesh)
            contrastive.check_config(config, mesh)
        # A workdir in use is refused before the data loads; the lock itself is taken only
        # after it (nothing is written before the task has loaded its data).
        run_lock.on_process_zero(run_lock.WorkdirLock(workdir).check_free)
        task = make_task(config, mesh)
        if task.num_examples < 1 or task.steps_per_epoch < 1:
            raise ValueError(f"{task.name}: no training examples ({task.num_examples}) or no "
                             "full batch of them; check the data and the batch size")
        contrastive.check_task(task.name, task.loss_fn, task.grad_accumulation, config)
        num_steps = configs.num_train_steps(config, task.steps_per_epoch)
        # Files are written from here on: a signal now ends the loop before its first step.
        stops.defer()
        with run_lock.hold(workdir) as lock:
            return _train(task, config, workdir, mesh, num_steps, stops=stops, lock=lock,
                          stop_after=stop_after)


def _check_resume(config: ml_collections.ConfigDict, workdir) -> None:
    # A run that stopped before its first checkpoint (bad data, SIGTERM at start-up) left
    # its config and nothing to resume: a retry with corrected settings is a fresh run,
    # whose config replaces the saved one.
    where = workdir / "checkpoints"
    if where.is_dir() and ocp.utils.checkpoint_steps(where):
        configs.check_resume(config, workdir)
    elif configs.config_path(workdir).is_file():
        logging.info("%s holds no checkpoint: nothing to resume, training afresh with this "
                     "config (it replaces %s)", workdir, configs.config_path(workdir).name)


def _train(task: Task, config: ml_collections.ConfigDict, workdir, mesh: Mesh,
           num_steps: int, *, stops: run_control.StopSignals,
           lock: run_lock.WorkdirLock | None, stop_after: int | None
           ) -> training.TrainState:
    # Rules fitted to this mesh once (an axis it cannot split is replicated, one warning),
    # so that the state and the step's activation constraints agree; checked before the
    # workdir's config is written, so a mistyped rule leaves no run behind.
    abstract_params = jax.eval_shape(task.init_params, jax.random.key(0))
    configs.check_rule_names(config, parallel.logical_dims(abstract_params))
    rules = parallel.fit_rules(configs.axis_rules(config), mesh, abstract_params,
                               task.logical_axis_sizes)
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        configs.save_config(config, workdir)
        for name, write in task.run_files.items():
            write(workdir / name)
    tx, schedule = (task.make_optimizer or default_optimizer)(config, num_steps)
    init_rng, dropout_rng = jax.random.split(jax.random.key(int(config.seed)))
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, init_rng, rules=rules, pretrained=task.pretrained)
    value_and_grad = contrastive.step_value_and_grad(
        task.name, task.loss_fn, task.grad_accumulation, config, mesh, shardings.params)
    step_fn = training.make_train_step(task.loss_fn, shardings, mesh, schedule=schedule,
                                       rules=rules, value_and_grad=value_and_grad,
                                       fused_table=task.fused_table)
    eval_fn = None
    if task.evaluate is not None and int(config.eval_every) > 0:
        eval_fn = lambda state, step: task.evaluate(state.params, step)
    logging.info("training %s for %d steps on %d examples (%d steps per epoch), global "
                 "batch %d, mesh %s%s", task.name, num_steps, task.num_examples,
                 task.steps_per_epoch, task.global_batch_size, dict(mesh.shape),
                 f"; {task.summary}" if task.summary else "")
    return training.train_loop(
        workdir=workdir, state=state, state_shardings=shardings, train_step=step_fn,
        make_batches=task.make_batches, mesh=mesh, num_train_steps=num_steps,
        rng=dropout_rng, seed=int(config.seed), global_batch_size=task.global_batch_size,
        log_every=int(config.log_every), checkpoint_every=int(config.checkpoint_every),
        keep_checkpoints=int(config.keep_checkpoints), eval_every=int(config.eval_every),
        eval_fn=eval_fn, hparams=config.to_dict(), stop_after=stop_after, stops=stops,
        lock=lock)
