"""The README's pod train command, read from the README, runs as two local processes with
the same command line: ``--config.coordinator_address=auto`` finds the coordinator, the
process count and each process's id in the environment, here Slurm's variables (JAX's
own cluster detection; on a TPU VM the metadata server), 4 CPU devices each. Only the
bucket (a local folder) and tiny-run overrides appended to the line differ from a pod's."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_train_line(command: str) -> str:
    """The README's "Pods and Colab" line that runs ``command`` (up to the loop's ``; rc=``)."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Pods and Colab")[1]
    section = section.split("\n## ")[0]
    lines = [line.strip().strip("`") for line in section.splitlines() if command in line]
    assert len(lines) == 1, lines
    return lines[0].split("; rc=")[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(argv: list[str]) -> list[str]:
    """``argv`` as two processes of 4 CPU devices found by Slurm's variables; their output."""
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                   JAX_PLATFORMS="cpu", JAX_COORDINATOR_PORT=str(port), SLURM_JOB_ID="1",
                   SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2",
                   SLURM_PROCID=str(pid), SLURM_LOCALID=str(pid))
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    for pid, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, out[-4000:]
        assert re.search(rf"process {pid} of 2, 4 local / 8 global devices", out), out[-4000:]
    return outputs


def _argv(line: str, bucket: Path) -> list[str]:
    assert "--config.coordinator_address=auto" in line and "$BUCKET/runs/" in line
    argv = shlex.split(line.replace("$BUCKET", str(bucket)))
    assert argv[0].startswith(".venv/bin/")
    argv[0] = str(Path(sys.executable).parent / argv[0].removeprefix(".venv/bin/"))
    return argv


def _check_run(workdir: Path, settings: dict) -> None:
    saved = json.loads((workdir / "run_config.json").read_text())
    assert {k: saved[k] for k in settings} == settings
    steps = [json.loads(x).get("step") for x in
             (workdir / "metrics.jsonl").read_text().splitlines()]
    assert 2 in steps
    assert (workdir / "checkpoints" / "2").is_dir()


@pytest.mark.pod_command
@pytest.mark.slow
def test_readme_pod_command_on_two_processes(tmp_path, tiny_bert_dir):
    argv = _argv(_readme_train_line("dualcse-jax train --config="), tmp_path / "bucket")
    # A tiny run: the tiny BERT, 2 steps of 8 premises per device (one GradCache chunk).
    argv += [f"--config.model={tiny_bert_dir}", "--config.num_train_steps=2",
             "--config.batch_size=64", "--config.max_train_examples=128",
             "--config.eval_every=0"]
    _two_processes(argv)
    _check_run(tmp_path / "bucket" / "runs" / "cross_tpu",
               {"remat": "dots", "dtype": "bfloat16", "contrastive_chunk_size": 8})


@pytest.mark.pod_command
@pytest.mark.slow
def test_readme_sentence_jax_pod_line_on_two_processes(tmp_path, tiny_bert_dir):
    """The README's sentence-jax line (``mnrl_tpu``, the preset found by name) on a
    triplets file in the bucket: CachedMNRL over both processes' rows."""
    from tests.sentence_jax.test_training import _triplets

    argv = _argv(_readme_train_line("sentence-jax train --config="), tmp_path / "bucket")
    data = [a.split("=", 1)[1] for a in argv if a.startswith("--config.train_files=")]
    assert len(data) == 1 and data[0].endswith(".csv")
    Path(data[0]).parent.mkdir(parents=True)
    _triplets(Path(data[0]), n=128)
    argv += [f"--config.model={tiny_bert_dir}", "--config.num_train_steps=2",
             "--config.batch_size=64", "--config.eval_every=0"]
    _two_processes(argv)
    _check_run(tmp_path / "bucket" / "runs" / "mnrl_tpu",
               {"remat": "dots", "dtype": "bfloat16", "mini_batch_size": 8,
                "loss": "CachedMultipleNegativesRankingLoss"})
