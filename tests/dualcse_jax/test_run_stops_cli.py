"""dualcse-jax train: a diverging run ends with one line and a finite latest checkpoint; a
workdir in use is refused (docs/architecture.md, "Stopping a run")."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from embedding_core.training import run_lock

# The diverging command on the tiny encoder; lr 1e30 (not 1e3) because the tiny
# model's LayerNorms keep a 1e3 run finite: step 1 is finite, step 2 is not.
DIVERGING = ["--config=dualcse_jax/configs/cross_cpu.py", "--config.log_every=3",
             "--config.checkpoint_every=1", "--config.keep_checkpoints=1",
             "--config.learning_rate=1e30", "--config.warmup_steps=0",
             "--config.lr_decay=constant", "--config.num_train_steps=6",
             "--config.max_length=32", "--config.batch_size=8",
             "--config.max_train_examples=64", "--config.eval_every=0"]


@pytest.fixture
def _train(cli):
    """``dualcse-jax train ARGS`` in this process and, in the slow tier, as a child."""
    return lambda *args: cli("dualcse_jax.main", "train", *args)


def test_a_diverging_run_ends_with_one_line_and_keeps_a_finite_checkpoint(
        tmp_path, tiny_bert_dir, _train):
    from dualcse_jax.inference import load

    workdir = tmp_path / "w"
    proc = _train(*DIVERGING, f"--workdir={workdir}", f"--config.model={tiny_bert_dir}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dualcse-jax train: error: training diverged: the loss, "
                           "gradient norm or parameters became non-finite at step 2; "), last
    assert f"the latest checkpoint, step 1 in {workdir / 'checkpoints'}, holds finite" in last
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
    assert not (workdir / "run.lock").exists()
    model = load(workdir)
    assert model.step == 1
    leaves = jax.tree_util.tree_leaves(model.params)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in leaves)


def test_a_workdir_in_use_is_refused_with_one_line(tmp_path, tiny_bert_dir, _train):
    workdir = tmp_path / "busy"
    # This test process holds the lock: a live run on this machine.
    with run_lock.WorkdirLock(workdir) as lock:
        proc = _train(*DIVERGING, f"--workdir={workdir}", f"--config.model={tiny_bert_dir}")
        assert lock.read()["token"] == lock.token
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dualcse-jax train: error: {workdir} is in use by another "
                           "training run (host "), last
    assert f"delete {workdir / 'run.lock'}" in last and "Traceback" not in proc.stderr
    assert sorted(p.name for p in workdir.iterdir()) == []  # nothing written
