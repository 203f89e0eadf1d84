"""Runs that never lose work: a diverged run saves nothing non-finite; SIGTERM and Ctrl-C
save a checkpoint and exit 75 / 130; a second Ctrl-C aborts (docs/architecture.md)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.distributed import parallel
from embedding_core.training import run_control, training
from embedding_core.training.run import run

WORKER = Path(__file__).with_name("stop_worker.py")
# A hang guard only: what a test checks never depends on how fast the machine is (the
# worker waits for the test's signal at a fixed point of its run, stop_worker.py).
HANG_GUARD_S = 1800
_spec = importlib.util.spec_from_file_location("stop_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def _restore_kernel(workdir: Path, step: int | None = None) -> tuple[int, np.ndarray]:
    model = worker.Linear()
    init = lambda k: model.init(k, np.zeros((1, worker.DIM), np.float32))["params"]
    step, params = training.restore_params(workdir / "checkpoints", init,
                                           parallel.make_mesh(8, 1), step=step)
    return step, np.asarray(params["kernel"])


def _steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("checkpoint_every,log_every,latest", [
    (1, 100, 1),  # found by the check before the save of step 2: checkpoint 1 is kept
    (100, 1, None),  # found in the logged metrics of step 2, before any save
])
@pytest.mark.mesh  # sets its own mesh shape
def test_a_diverged_run_stops_and_keeps_its_last_finite_checkpoint(
        tmp_path, checkpoint_every, log_every, latest):
    # lr 1e38: step 1 moves the kernel to ~1e38 (finite), step 2's loss overflows to inf.
    config = worker.config(6, learning_rate=1e38, checkpoint_every=checkpoint_every,
                           log_every=log_every, keep_checkpoints=1)
    with pytest.raises(run_control.DivergedError) as info:
        run(worker.make_task(), config, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "the loss, gradient norm or parameters became non-finite at step 2" in message
    if latest is None:
        assert "no checkpoint was written" in message
        assert not (tmp_path / "checkpoints").exists() or _steps(tmp_path) == []
    else:
        assert f"the latest checkpoint, step 1 in {tmp_path / 'checkpoints'}" in message
        # keep_checkpoints=1 would have deleted checkpoint 1 had step 2 been saved.
        assert _steps(tmp_path) == [1]
        step, kernel = _restore_kernel(tmp_path)
        assert step == 1 and np.isfinite(kernel).all() and np.abs(kernel).max() > 1e37
    assert not (tmp_path / "run.lock").exists()


@pytest.mark.mesh  # sets its own mesh shape
def test_params_that_overflow_under_a_finite_loss_are_never_saved(tmp_path):
    """Step 2's loss and gradient are finite but its update (lr inf) makes the kernel
    non-finite: the flag names step 2 and checkpoint 1 stays the latest."""
    import dataclasses

    import jax.numpy as jnp
    import optax

    schedule = lambda count: jnp.where(count < 1, 0.05, jnp.inf)

    def make_task(config, mesh):
        return dataclasses.replace(worker.make_task()(config, mesh),
                                   make_optimizer=lambda c, n: (optax.sgd(schedule), schedule))

    config = worker.config(4, checkpoint_every=1, log_every=100, keep_checkpoints=1)
    with pytest.raises(run_control.DivergedError) as info:
        run(make_task, config, tmp_path)
    message = str(info.value)
    assert "non-finite at step 2" in message, message
    assert f"the latest checkpoint, step 1 in {tmp_path / 'checkpoints'}" in message
    assert _steps(tmp_path) == [1]
    step, kernel = _restore_kernel(tmp_path)
    assert step == 1 and np.isfinite(kernel).all() and np.abs(kernel).max() > 0


@pytest.mark.mesh  # sets its own mesh shape
def test_train_step_flags_the_first_nonfinite_step():
    """The flag is set on device by the step itself and keeps the first bad step."""
    import jax.numpy as jnp
    import optax

    mesh = parallel.make_mesh(8, 1)
    tx = optax.sgd(1.0)
    init = lambda k: {"w": jnp.zeros((2,))}
    state, shardings = training.create_sharded_state(init, tx, mesh, jax.random.key(0))
    assert int(state.first_nonfinite_step) == -1

    def loss_fn(params, batch, rng):
        return jnp.sum(params["w"] * batch["x"].sum(0)), {}

    step = training.make_train_step(loss_fn, shardings, mesh)
    rows = lambda v: {"x": np.full((8, 2), v, np.float32)}
    rng = jax.random.key(1)
    state, _ = step(state, rows(1.0), rng)
    assert int(state.first_nonfinite_step) == -1
    state, _ = step(state, rows(np.nan), rng)
    state, _ = step(state, rows(1.0), rng)
    assert int(state.first_nonfinite_step) == 2 and int(state.step) == 3


def _start(workdir: Path, steps: int, slow_from: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(WORKER), str(workdir), str(steps),
                             str(slow_from)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()  # blocks until the loop asks for the slow batches
    if not line.startswith("READY"):
        proc.kill()
        raise AssertionError(line + proc.communicate()[1][-3000:])
    return proc


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def _sigterm_self(step=None) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class _SigtermOnFirstCheck:
    """A ``go`` file (stop_worker.make_task) whose first check sends this process SIGTERM
    and which never exists: the in-process form of a signal during the data load."""

    def __init__(self):
        self.sent = False

    def exists(self) -> bool:
        if not self.sent:
            self.sent = True
            _sigterm_self()
        return False


def _in_process(make_task, steps: int, workdir: Path) -> int:
    """The stop worker's run in this process under the CLI's error handling: the exit
    status."""
    from embedding_core.cli import user_errors

    with pytest.raises(SystemExit) as exit_info, user_errors("stop-worker", "train"):
        run(make_task, worker.config(steps), workdir)
    return exit_info.value.code


def test_sigterm_saves_and_exits_75_in_process(tmp_path, capsys):
    """The in-process side of the child-process test below (SIGTERM at step 3)."""
    workdir, steps = tmp_path / "w", 40
    code = _in_process(worker.make_task(slow_from=3, on_slow=_sigterm_self), steps, workdir)
    _sigterm_saved(code, capsys.readouterr().err, workdir, steps)


@pytest.mark.slow
def test_sigterm_saves_and_exits_75(tmp_path):
    workdir, steps = tmp_path / "w", 40
    proc = _start(workdir, steps, slow_from=3)  # steps 1-3 ran; SIGTERM mid-run
    proc.send_signal(signal.SIGTERM)
    worker.release(workdir)  # the loop goes on only now, the signal handled
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    _sigterm_saved(proc.returncode, err, workdir, steps)


def _sigterm_saved(code: int, err: str, workdir: Path, steps: int) -> None:
    assert code == run_control.EXIT_PREEMPTED == 75, err[-3000:]
    line = _last_line(err)
    assert line.startswith("stop-worker train: preempted (SIGTERM) at step "), line
    first = int(line.split("at step ")[1].split(":")[0])
    assert 3 <= first < steps and _steps(workdir) == [first]
    assert "run the same command to resume (exit code 75)" in line
    assert "Traceback" not in err and not (workdir / "run.lock").exists()


def test_sigterm_during_start_up_exits_75_at_once_in_process(tmp_path, capsys):
    """The in-process side of the child-process test below (SIGTERM in the data load)."""
    workdir = tmp_path / "w"
    code = _in_process(worker.make_task(slow_from=-1, go=_SigtermOnFirstCheck()), 10,
                       workdir)
    out, err = capsys.readouterr()
    assert out.startswith("READY load"), out
    _stopped_at_start_up(code, out, err, workdir)


@pytest.mark.slow
def test_sigterm_during_start_up_exits_75_at_once(tmp_path):
    workdir = tmp_path / "w"
    proc = _start(workdir, 10, slow_from=-1)  # the task is loading its data
    proc.send_signal(signal.SIGTERM)
    # The load may end now: a run that waited for it (instead of stopping at once) would
    # print LOADED and go on to its first step, whatever the machine's speed.
    worker.release(workdir)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    _stopped_at_start_up(proc.returncode, out, err, workdir)


def _stopped_at_start_up(code: int, out: str, err: str, workdir: Path) -> None:
    assert code == 75, err[-3000:]
    assert "LOADED" not in out, out  # stopped in the load, not after it
    assert _last_line(err) == ("stop-worker train: preempted (SIGTERM) before the first step "
                               "(nothing to save); run the same command to resume (exit "
                               "code 75)")
    assert not workdir.exists() or not any(workdir.iterdir())  # nothing written


def test_a_second_ctrl_c_names_the_latest_complete_checkpoint(tmp_path, capsys):
    import logging

    from embedding_core.cli import user_errors

    def twice(step):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # raises in the loop's batch fetch

    workdir = tmp_path / "w"
    try:
        with pytest.raises(SystemExit) as exit_info, user_errors("t", "train"):
            run(worker.make_task(slow_from=5, on_slow=twice),
                worker.config(20, checkpoint_every=2), workdir)
    finally:
        for handler in logging.getLogger().handlers:
            handler.removeFilter(run_control._drop_orbax)
    assert exit_info.value.code == 130
    assert _steps(workdir) == [2, 4]
    assert _last_line(capsys.readouterr().err) == (
        "t train: aborted (second Ctrl-C) at step 5, the step or save in flight lost: the "
        f"latest complete checkpoint is step 4 in {workdir / 'checkpoints'}; run the same "
        "command to resume from it")
    assert not (workdir / "run.lock").exists()


def test_ctrl_c_saves_exits_130_and_the_resumed_run_is_exact(tmp_path, capsys):
    from embedding_core.cli import user_errors

    workdir, steps = tmp_path / "w", 20
    # The loop's own process gets Ctrl-C while it fetches the batch of step 5.
    ctrl_c = lambda step: os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(SystemExit) as exit_info, user_errors("t", "train"):
        run(worker.make_task(slow_from=5, on_slow=ctrl_c), worker.config(steps), workdir)
    assert exit_info.value.code == run_control.EXIT_INTERRUPTED == 130
    line = _last_line(capsys.readouterr().err)
    # The step in flight finishes, then the checkpoint: step 6.
    assert line == (f"t train: interrupted (Ctrl-C) at step 6: checkpoint saved in "
                    f"{workdir / 'checkpoints'}; run the same command to resume")
    assert _steps(workdir) == [6] and not (workdir / "run.lock").exists()
    resumed = run(worker.make_task(), worker.config(steps), workdir)
    reference = run(worker.make_task(), worker.config(steps), tmp_path / "reference")
    np.testing.assert_array_equal(np.asarray(resumed.params["kernel"]),
                                  np.asarray(reference.params["kernel"]))


def test_a_second_ctrl_c_aborts_at_once_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with run_control.StopSignals() as stops:
        assert not stops.requested
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs between bytecodes of the main thread
        assert stops.signum == signal.SIGINT and stops.should_stop(0)
        os.kill(os.getpid(), signal.SIGTERM)  # a later SIGTERM changes nothing
        time.sleep(0.01)
        assert stops.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert isinstance(stops.stopped(5, "W"), run_control.Interrupted)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    stopped = run_control.StopSignals()
    stopped.signum = signal.SIGTERM
    early = stopped.stopped(-1, "W")
    assert isinstance(early, run_control.Preempted) and "before the first step" in str(early)
