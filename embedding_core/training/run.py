"""``run(make_task, config, workdir)``: the one way every model is trained
(``docs/architecture.md``, "The Task seam")."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import ml_collections
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.losses import contrastive
from embedding_core.models import hub
from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object, write_json
from embedding_core.training import (
    checkpoints,
    data_fingerprint,
    loop,
    run_control,
    run_lock,
    training,
)
from embedding_core.training.task import Task, checked_batches


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
    """Trains (or resumes) ``make_task(config, mesh)`` into ``workdir``; nothing is written
    before the task has loaded its data.
    Raises: ValueError, NotADirectoryError, what the task raises; run_control's
    WorkdirInUseError, DivergedError, Preempted, Interrupted, Aborted."""
    # Multi-process is decided from the config: asking JAX would start its backend too early.
    distributed = bool(config.coordinator_address
                       or os.environ.get("JAX_COORDINATOR_ADDRESS")
                       or jax.distributed.is_initialized())
    with run_control.StopSignals(multiprocess=distributed, immediate=True) as stops:
        fields = getattr(validate, "fields", None)  # configs.validator's declarations
        configs.validate_base(config, fields)
        if validate is not None:
            validate(config)
        workdir = training.check_workdir(workdir)
        checkpoints.check_layout(workdir / "checkpoints")
        _pin_models(config, workdir, fields)
        _check_resume(config, workdir, fields)
        fingerprint, data_changes = _check_data(config, workdir, fields)
        mesh = parallel.mesh_from_config(config)
        if distributed and jax.process_count() == 1:
            stops.multiprocess = False
            stops.install()
        split = contrastive.StepSplit.from_config(config)
        if "batch_size" in config:
            parallel.check_global_batch(int(config.batch_size), mesh)
            split.check(int(config.batch_size), mesh)
        # A workdir in use is refused before the data loads; the lock is taken after it.
        run_lock.on_process_zero(run_lock.WorkdirLock(workdir).check_free)
        eval_files = _eval_files(config)  # bad files fail here, before anything loads
        _log_loading(config, fields)
        task = make_task(config, mesh)
        if task.num_examples < 1 or task.steps_per_epoch < 1:
            raise ValueError(f"{task.name}: no training examples ({task.num_examples}) or no "
                             "full batch of them; check the data and the batch size")
        split.check_task(task.name, task.loss_fn, task.grad_accumulation)
        num_steps = configs.num_train_steps(config, task.steps_per_epoch)
        _check_target(workdir, num_steps)
        if data_changes:  # after the target check: an error comes alone, not after this
            logging.warning("%s; resuming at step %d with the new data (resume_changed_data)",
                            "; ".join(data_changes), _saved_step(workdir))
        # Files are written from here on: a signal now ends the loop before its first step.
        stops.defer()
        with run_lock.hold(workdir) as lock:
            return _train(task, config, workdir, mesh, num_steps, split, stops=stops,
                          lock=lock, stop_after=stop_after, eval_files=eval_files,
                          fingerprint=fingerprint)


def _log_loading(config: ml_collections.ConfigDict, fields) -> None:
    # Loading takes seconds to minutes: a new user should see that the run has started.
    fields = fields or {}
    models = [f"{n}={config[n]}" for n, f in fields.items() if f.pretrained and n in config]
    data = ", ".join(f"{n}={config[n]}" for n in data_fingerprint.data_fields(config, fields))
    logging.info("loading %s and the training data%s ...", ", ".join(models) or "the model",
                 f" ({data})" if data else "")


def _pin_models(config: ml_collections.ConfigDict, workdir, fields) -> None:
    # A hub id is recorded with its commit, so a resume (and `load`) uses the same weights.
    names = [n for n, f in (fields or {}).items() if f.pretrained and n in config]
    if not names:
        return
    path = configs.config_path(workdir)
    saved = read_json_object(path) if path.is_file() else {}
    for name in names:
        pinned = hub.pin(str(config[name]), saved.get(name))
        if pinned != config[name]:
            logging.info("config.%s=%s: pinned to %s", name, config[name], pinned)
            config[name] = pinned


def _check_resume(config: ml_collections.ConfigDict, workdir, fields=None) -> None:
    # Without a checkpoint a retry with corrected settings is a fresh run.
    where = workdir / "checkpoints"
    if where.is_dir() and ocp.utils.checkpoint_steps(where):
        configs.check_resume(config, workdir, fields)
    elif configs.config_path(workdir).is_file():
        logging.info("%s holds no checkpoint: nothing to resume, training afresh with this "
                     "config (it replaces %s)", workdir, configs.config_path(workdir).name)


def _saved_step(workdir) -> int | None:
    where = workdir / "checkpoints"
    steps = ocp.utils.checkpoint_steps(where) if where.is_dir() else []
    return max(steps) if steps else None


def _check_data(config: ml_collections.ConfigDict, workdir, fields
                ) -> tuple[dict, list[str]]:
    """``(fingerprint, changes resume_changed_data accepts)``. Raises FileNotFoundError;
    DataChangedError: a file changed and ``resume_changed_data`` is off."""
    names = data_fingerprint.data_fields(config, fields)
    file = data_fingerprint.path(workdir)
    step = _saved_step(workdir)
    saved = data_fingerprint.read(file) if step is not None and file.is_file() else None
    if step is not None and saved is None and names:
        logging.info("%s holds no %s (written before fingerprints): the data is not checked "
                     "this time and is recorded now", workdir, data_fingerprint.FILE)
    now = data_fingerprint.fingerprint(config, names, known=saved)
    changed = data_fingerprint.changes(saved, now) if saved is not None else []
    if changed and not config.resume_changed_data:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise data_fingerprint.DataChangedError(
            f"{changed[0]}{more} since the run in {workdir} last started: resuming at step "
            f"{step} would "
            "read other examples in another order; use a new --workdir, or "
            f"--config.resume_changed_data=true to go on from step {step} with the new data")
    return now, changed


def _check_target(workdir, num_steps: int) -> None:
    # Equal is a finished run (a re-run is a no-op); below would silently do nothing.
    step = _saved_step(workdir)
    if step is not None and step > num_steps:
        raise ValueError(f"{workdir} is trained to step {step}, past the {num_steps} steps "
                         "this config asks for (num_train_steps / num_epochs): nothing to "
                         f"train; ask for more than {step} steps to go on, or evaluate / "
                         "export it as it is")


def _eval_files(config: ml_collections.ConfigDict) -> list:
    """``config.eval_files`` as ``(spec, evaluator)``. Raises FileNotFoundError, ValueError,
    DataError, StorageUnavailableError."""
    if int(config.eval_every) <= 0 or not config.get("eval_files"):
        return []
    from embedding_core.evaluation import run as evaluation

    specs = evaluation.parse(str(config.eval_files), batch_size=int(config.eval_batch_size))
    # Without it a gs:// URI with no credentials retries for a minute, naming nothing.
    storage.check_endpoint([spec.file for spec in specs])
    return evaluation.build_all(specs)


def _eval_fn(task: Task, config: ml_collections.ConfigDict, built: list):
    """``(state, step) -> metrics`` of the task's evaluation and ``built`` (``[VIEW/]LABEL/
    NAME``), or ``None``. Raises ValueError: eval files without ``encoder_of``."""
    if int(config.eval_every) <= 0:
        return None
    parts = []
    if task.evaluate is not None:
        parts.append(lambda state, step: task.evaluate(state.params, step))
    if built:
        from embedding_core.evaluation import run as evaluation

        if task.encoder_of is None:
            raise ValueError(f"config.eval_files: {task.name} does not take evaluation files "
                             "yet")

        def files(state, step):
            encoder = task.encoder_of(state.params, step)
            views = encoder if isinstance(encoder, Mapping) else {"": encoder}
            out = {}
            for view, one in views.items():  # a two-view model: "VIEW/LABEL/NAME"
                flat = evaluation.flat_metrics(evaluation.evaluate(one, built))
                out.update({f"{view}/{k}" if view else k: v for k, v in flat.items()})
            return out

        parts.append(files)
    if not parts:
        return None
    return lambda state, step: {k: v for part in parts for k, v in part(state, step).items()}


def _train(task: Task, config: ml_collections.ConfigDict, workdir, mesh: Mesh,
           num_steps: int, split: contrastive.StepSplit, *, stops: run_control.StopSignals,
           lock: run_lock.WorkdirLock | None, stop_after: int | None, eval_files: list,
           fingerprint: dict) -> training.TrainState:
    logging.info("training %s for %d steps on %d examples (%d steps per epoch), global "
                 "batch %d, mesh %s%s", task.name, num_steps, task.num_examples,
                 task.steps_per_epoch, task.global_batch_size, dict(mesh.shape),
                 f"; {task.summary}" if task.summary else "")
    # Rules fitted once (state and step agree), before the config is written.
    abstract_params = jax.eval_shape(task.init_params, jax.random.key(0))
    configs.check_rule_names(config, parallel.logical_dims(abstract_params))
    rules = parallel.fit_rules(configs.axis_rules(config), mesh, abstract_params,
                               task.logical_axis_sizes)
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        configs.save_config(config, workdir)
        write_json(data_fingerprint.path(workdir), fingerprint)
        for name, write in task.run_files.items():
            write(workdir / name)
    tx, schedule = (task.make_optimizer or default_optimizer)(config, num_steps)
    init_rng, dropout_rng = jax.random.split(jax.random.key(int(config.seed)))
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, init_rng, rules=rules, pretrained=task.pretrained)
    value_and_grad = split.value_and_grad(task.loss_fn, task.grad_accumulation, mesh,
                                          shardings.params)
    step_fn = training.make_train_step(task.loss_fn, shardings, mesh, schedule=schedule,
                                       rules=rules, value_and_grad=value_and_grad,
                                       table_update=task.table_update)
    eval_fn = _eval_fn(task, config, eval_files)

    def compile_step(state, batch, rng):
        # make_train_step's context: the first step finds this executable in jit's cache.
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            step_fn.jitted.lower(state, batch, rng).compile()

    settings = loop.LoopSettings.from_config(config, num_steps, task.global_batch_size, stop_after)
    return loop.train_loop(
        workdir=workdir, state=state, state_shardings=shardings, train_step=step_fn,
        make_batches=checked_batches(task.make_batches, task.batch_spec, task.name),
        mesh=mesh, rng=dropout_rng, settings=settings, eval_fn=eval_fn,
        hparams=config.to_dict(), stops=stops, lock=lock, compile_step=compile_step)
