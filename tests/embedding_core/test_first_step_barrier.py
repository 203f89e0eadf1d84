"""Two training processes on one coordinator, the second reaching its first step 45 s after
the first (``first_step_worker.py``): gloo gives a collective 30 s, so the first step's
collectives must not start before every process is there (``embedding_core/training/loop.py`` waits
at a coordination-service barrier after compiling the step)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.embedding_core import first_step_worker
from tests.shared_runs import DUALCSE_TINY

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(first_step_worker.__file__)
DELAY_S = 45  # past gloo's fixed 30 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.slow_multiprocess
def test_a_process_45_s_late_to_its_first_step_trains_with_the_other(tmp_path, tiny_bert_dir):
    workdir = tmp_path / "run"
    port = _free_port()
    tiny = dict(DUALCSE_TINY, model=str(tiny_bert_dir), num_train_steps=2, checkpoint_every=2)
    argv = [sys.executable, str(WORKER), "train", "--config=dualcse_jax/configs/default.py",
            f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in tiny.items()),
            f"--config.coordinator_address=localhost:{port}", "--config.num_processes=2"]
    procs = []
    for pid in range(2):
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                   JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
        env[first_step_worker.DELAY_ENV] = str(DELAY_S if pid == 1 else 0)
        procs.append(subprocess.Popen([*argv, f"--config.process_id={pid}"], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    assert f"{first_step_worker.DELAYED} {DELAY_S} s" in outputs[1]
    assert first_step_worker.DELAYED not in outputs[0]
    # Process 0 compiled, then waited for process 1 at the coordination service.
    assert "first train step: process 0 of 2 waits for the others (up to 1800 s)" in outputs[0]
    metrics = (workdir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line).get("step") for line in metrics]
    assert steps[-1] == 2, steps
    assert (workdir / "checkpoints" / "2").is_dir()
