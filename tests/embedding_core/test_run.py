"""The core's run(): a tiny linear-regression Task trained, resumed and restored."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.training import checkpoints, training
from embedding_core.training.run import run
from embedding_core.training.task import Task

DIM, ROWS = 4, 64


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.zeros, ("mlp", "embed")), (DIM, 1))
        return (x @ w)[:, 0]


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    return x, x @ np.arange(1, DIM + 1, dtype=np.float32)


def _config(**kw):
    c = configs.base()
    c.batch_size = 8
    c.learning_rate = 0.05
    c.lr_decay = "constant"
    c.num_train_steps = 12
    c.log_every = 2
    c.checkpoint_every = 4
    c.eval_every = 6
    for k, v in kw.items():
        c[k] = v
    return c


def _make_task(evals: list):
    x, y = _data()
    model = Linear()

    def make_batches(start_step):
        step = start_step
        while True:
            rows = np.random.default_rng(step).choice(ROWS, 8, replace=False)
            yield {"x": x[rows], "y": y[rows], "step": np.int32(step)}
            step += 1

    def loss_fn(params, batch, rng):
        err = model.apply({"params": params}, batch["x"]) - batch["y"]
        return jnp.mean(err ** 2), {"abs_err": jnp.mean(jnp.abs(err))}

    def evaluate(params, step):
        evals.append(step)
        return {"mse": float(np.mean((x @ np.asarray(params["kernel"]))[:, 0] - y) ** 2)}

    def make(config, mesh):
        return Task(name="linear", init_params=lambda k: model.init(k, x[:1])["params"],
                    loss_fn=loss_fn, make_batches=make_batches, num_examples=ROWS,
                    steps_per_epoch=ROWS // 8, global_batch_size=8, evaluate=evaluate,
                    run_files={"note.txt": lambda p: p.write_text("hi")})

    return make


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("full")
    evals: list = []
    state = run(_make_task(evals), _config(), workdir)
    return workdir, state, evals


def test_run_trains_writes_files_and_evaluates(full_run):
    workdir, state, evals = full_run
    assert int(state.step) == 12
    assert evals == [6, 12]
    assert (workdir / "note.txt").read_text() == "hi"
    saved = configs.read_config(workdir, _config, prog="t")
    assert saved.num_train_steps == 12 and saved.batch_size == 8
    # the loss went down: the kernel moved towards [1, 2, 3, 4]
    kernel = np.asarray(state.params["kernel"])[:, 0]
    assert np.linalg.norm(kernel - np.arange(1, 5)) < np.linalg.norm(np.arange(1, 5))


def test_resume_equals_uninterrupted_run(full_run, tmp_path, caplog):
    _, state, _ = full_run
    run(_make_task([]), _config(), tmp_path, stop_after=5)
    with caplog.at_level("INFO"):
        resumed = run(_make_task([]), _config(), tmp_path)
        again = run(_make_task([]), _config(), tmp_path)  # finished: trains no further
    np.testing.assert_allclose(np.asarray(resumed.params["kernel"]),
                               np.asarray(state.params["kernel"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(again.params["kernel"]),
                                  np.asarray(resumed.params["kernel"]))
    said = [r.getMessage() for r in caplog.records]
    assert "resuming at step 5" in said and "training already finished at step 12" in said


@pytest.mark.mesh  # sets its own mesh shape
def test_params_only_restore_onto_another_mesh(full_run):
    workdir, state, _ = full_run
    model = Linear()
    init = lambda k: model.init(k, np.zeros((1, DIM), np.float32))["params"]
    mesh = parallel.make_mesh(4, 2)
    step, params = training.restore_params(workdir / "checkpoints", init, mesh)
    assert step == 12
    assert set(params) == {"kernel"}  # no optimizer state anywhere
    assert params["kernel"].sharding.spec == jax.sharding.PartitionSpec("model", None)
    np.testing.assert_array_equal(np.asarray(params["kernel"]),
                                  np.asarray(state.params["kernel"]))
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 3"):
        training.restore_params(workdir / "checkpoints", init, mesh, step=3)


def test_old_single_item_checkpoint_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "checkpoints" / "7" / "state").mkdir(parents=True)
    with pytest.raises(checkpoints.IncompatibleCheckpointError, match="older embedding-jax"):
        run(_make_task([]), _config(), tmp_path)
    assert not (tmp_path / configs.CONFIG_FILE).exists()


@pytest.mark.mesh  # sets its own mesh shape
def test_old_single_item_checkpoint_is_refused_with_a_clear_message(tmp_path):
    (tmp_path / "7" / "state").mkdir(parents=True)
    (tmp_path / "7" / "_CHECKPOINT_METADATA").write_text("{}")
    model = Linear()
    init = lambda k: model.init(k, np.zeros((1, DIM), np.float32))["params"]
    mesh = parallel.make_mesh(8, 1)
    with pytest.raises((checkpoints.IncompatibleCheckpointError, FileNotFoundError),
                       match="older embedding-jax|no checkpoint"):
        training.restore_params(tmp_path, init, mesh)


def test_bad_shared_config_is_refused_before_anything_runs(tmp_path):
    for field, value, match in (("lr_decay", "step", "lr_decay"),
                                ("log_every", 0, "log_every"),
                                ("learning_rate", 0.0, "learning_rate"),
                                ("learning_rate", float("inf"), "learning_rate must be a "
                                 "finite number, got inf"),
                                ("grad_clip_norm", float("nan"), "grad_clip_norm must be a "
                                 "finite number")):
        with pytest.raises(ValueError, match=match):
            run(_make_task([]), _config(**{field: value}), tmp_path / "x")
        assert not (tmp_path / "x").exists()


def test_a_changed_model_setting_is_refused_and_the_saved_config_kept(full_run, tmp_path):
    import shutil

    workdir = tmp_path / "copy"
    shutil.copytree(full_run[0], workdir)
    before = (workdir / configs.CONFIG_FILE).read_text()
    with pytest.raises(ValueError, match=r"learning_rate=0.05 -> 0.1"):
        run(_make_task([]), _config(learning_rate=0.1), workdir)
    # Another model's config lacks fields this run saved (a new version's extra fields, in
    # the other direction, are tolerated: their defaults rebuild the old model).
    fields = _config().to_dict()
    for name in ("batch_size", "seed", "coordinator_address", "num_processes"):
        del fields[name]
    other = ml_collections.ConfigDict(dict(fields, pooling="cls", architecture="x"))
    with pytest.raises(ValueError, match="another model"):
        configs.check_resume(other, workdir)
    newer = _config()
    newer.new_field_of_a_later_version = 1
    newer.tag_threshold, newer.eval_batch_size = 3, 7  # evaluation fields are resumable
    configs.check_resume(newer, workdir)  # no error
    assert (workdir / configs.CONFIG_FILE).read_text() == before
    # Loop fields may change: a longer run continues from the saved step.
    state = run(_make_task([]), _config(num_train_steps=14, log_every=7), workdir)
    assert int(state.step) == 14


def test_a_run_that_stopped_before_its_first_checkpoint_takes_new_settings(tmp_path):
    """Bad data after the config was saved: no checkpoint, so a retry with other settings is
    a fresh run and its config replaces the saved one."""
    def broken(config, mesh):
        task = _make_task([])(config, mesh)
        def bad_rows(start):
            raise ValueError("data.csv, line 3: field 'y' is not a number")
            yield

        task.make_batches = bad_rows
        return task

    with pytest.raises(ValueError, match="line 3"):
        run(broken, _config(learning_rate=0.1), tmp_path)
    assert configs.read_config(tmp_path, _config, prog="t").learning_rate == 0.1
    state = run(_make_task([]), _config(num_train_steps=4), tmp_path)
    assert int(state.step) == 4
    assert configs.read_config(tmp_path, _config, prog="t").learning_rate == 0.05
    with pytest.raises(ValueError, match=r"learning_rate=0.05 -> 0.1"):  # now it has one
        run(_make_task([]), _config(learning_rate=0.1, num_train_steps=4), tmp_path)


@pytest.mark.mesh  # sets its own mesh shape
def test_a_damaged_checkpoint_names_its_folder(full_run, tmp_path):
    import shutil

    workdir = tmp_path / "damaged"
    shutil.copytree(full_run[0], workdir)
    shutil.rmtree(workdir / "checkpoints" / "12" / "params")
    model = Linear()
    init = lambda k: model.init(k, np.zeros((1, DIM), np.float32))["params"]
    with pytest.raises(checkpoints.DamagedCheckpointError, match=r"checkpoints/12: .*--step=8"):
        training.restore_params(workdir / "checkpoints", init, parallel.make_mesh(8, 1))


def test_a_workdir_of_the_old_layout_resumes_and_an_hf_config_is_not_a_run(full_run, tmp_path):
    import shutil

    # Before run_config.json, the run config was config.json: still read, checked, resumed.
    workdir = tmp_path / "old"
    shutil.copytree(full_run[0], workdir)
    (workdir / configs.CONFIG_FILE).rename(workdir / configs.LEGACY_CONFIG_FILE)
    legacy = (workdir / configs.LEGACY_CONFIG_FILE).read_text()
    assert configs.config_path(workdir) == workdir / configs.LEGACY_CONFIG_FILE
    with pytest.raises(ValueError, match=r"learning_rate=0.05 -> 0.1"):
        run(_make_task([]), _config(learning_rate=0.1), workdir)
    state = run(_make_task([]), _config(num_train_steps=14), workdir)
    assert int(state.step) == 14
    # The resumed run saved run_config.json, which now wins; the old file is left alone.
    assert configs.read_config(workdir, _config, prog="t").num_train_steps == 14
    assert (workdir / configs.LEGACY_CONFIG_FILE).read_text() == legacy
    # A Hugging Face model's config.json is not a run config.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert", "hidden_size": 32}')
    assert configs.config_path(hf) == hf / configs.CONFIG_FILE
    configs.check_resume(_config(), hf)  # nothing to resume, nothing refused
    with pytest.raises(FileNotFoundError, match="run_config.json not found: is .* a t "):
        configs.read_config(hf, _config, prog="t")


def _scripted_task(scores: dict):
    """The linear task, its evaluation reading ``scores[step]`` (a metric that peaks
    before the end)."""
    base = _make_task([])

    def make(config, mesh):
        task = base(config, mesh)
        task.evaluate = lambda params, step: {"score": scores[step]}
        return task

    return make


@pytest.mark.mesh  # sets its own mesh shape
@pytest.mark.parametrize("stop_after", [None, 5])
def test_select_metric_keeps_the_best_checkpoint_and_loaders_take_it(tmp_path, stop_after):
    import json

    scores = {2: 0.5, 4: 0.9, 6: 0.1, 8: 0.2}
    config = _config(num_train_steps=8, eval_every=2, checkpoint_every=100,
                     keep_checkpoints=1, select_metric="score")
    if stop_after:  # stopped after step 5, resumed: the best survives the restart
        run(_scripted_task(scores), config, tmp_path, stop_after=stop_after)
    run(_scripted_task(scores), config, tmp_path)
    best = json.loads((tmp_path / checkpoints.BEST_FILE).read_text())
    assert best == {"metric": "score", "value": 0.9, "step": 4}
    kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                  if p.name.isdigit())
    assert kept == [4, 8]  # the best, and the newest (keep_checkpoints=1) to resume from
    init = lambda k: Linear().init(k, np.zeros((1, DIM), np.float32))["params"]
    step, _ = training.restore_params(tmp_path / "checkpoints", init, parallel.make_mesh(8, 1))
    assert step == 4  # evaluate and export load the best
    with pytest.raises(ValueError, match="select_metric='nope' is not among"):
        run(_scripted_task(scores), _config(num_train_steps=2, eval_every=2,
                                            select_metric="nope"), tmp_path / "other")
    with pytest.raises(ValueError, match="need config.eval_every > 0"):
        run(_scripted_task(scores), _config(select_metric="score", eval_every=0),
            tmp_path / "third")


def test_orphaned_writes_of_a_reported_failure_are_not_logged_again(tmp_path, caplog):
    """orbax's array writes whose failures nobody collected (its loop stopped at the first)
    are logged by asyncio when garbage-collected: dropped once that folder's failure was
    raised as one CheckpointWriteError, kept for any other folder."""
    import asyncio
    import gc

    def orphan(folder):
        async def write():
            raise ValueError(f"PERMISSION_DENIED: Error writing {folder}/params/x: Forbidden")

        loop = asyncio.new_event_loop()
        loop.create_task(write())
        loop.run_until_complete(asyncio.sleep(0))  # the write ran and failed; not awaited
        loop.create_future().set_exception(ValueError(f"Error reading {folder}/params/y"))
        loop.close()
        gc.collect()

    manager = checkpoints.make_manager(tmp_path / "checkpoints", async_save=False)
    with pytest.raises(checkpoints.CheckpointWriteError,
                       match=r"checkpoints/3: checkpoint write failed: .*Forbidden"):
        with checkpoints._writing(manager, 3):
            raise ValueError(f"PERMISSION_DENIED: Error writing {tmp_path}/checkpoints/3/"
                             "params/manifest: Forbidden")
    with caplog.at_level("ERROR", logger="asyncio"):
        orphan(tmp_path / "checkpoints" / "3")
        assert caplog.records == []
        orphan(tmp_path / "checkpoints" / "4")  # a folder that did not fail: still logged
        assert sorted(r.getMessage().splitlines()[0] for r in caplog.records) == [
            "Future exception was never retrieved", "Task exception was never retrieved"]
