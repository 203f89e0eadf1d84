"""Runs ``bench_dualcse.py``'s comparison in one child process per ``OMP_WAIT_POLICY``.

Each child gets ``OMP_WAIT_POLICY`` (before torch is imported), ``JAX_PLATFORMS=cpu`` and
``XLA_FLAGS`` set to the thread flags this jaxlib accepts (an unknown XLA flag aborts the
process, so each candidate is tried alone in a throwaway process first); the child pins
its own CPU affinity. Each child's last stdout line is its JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

POLICIES = ("PASSIVE", "ACTIVE")
_PROBE = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"


def cpu_model() -> str:
    """``model name`` from /proc/cpuinfo (``"unknown"`` where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f
                         if ln.startswith("model name")), "unknown")
    except OSError:
        return "unknown"


def xla_thread_flags(threads: int) -> tuple[list[str], list[str]]:
    """``(accepted, refused)`` XLA thread flags, each tried alone in a subprocess (a bare
    token after a ``--`` flag is silently ignored by XLA's parser, so none is passed)."""
    accepted, refused = [], []
    for flag in ("--xla_cpu_multi_thread_eigen=true",
                 f"--intra_op_parallelism_threads={threads}"):
        env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        (accepted if proc.returncode == 0 else refused).append(flag)
    return accepted, refused


def run_child(argv: Sequence[str], policy: str, xla_flags: Sequence[str]) -> dict:
    """Runs ``argv`` with ``OMP_WAIT_POLICY=policy``, echoing its stdout line by line
    (prefixed ``[policy]``); returns its last line parsed as JSON.

    Raises:
      SystemExit: the child failed or its last line is not JSON (the line is quoted).
    """
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": " ".join(xla_flags)}
    last = ""
    with subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            last = line.strip() or last
            print(f"[{policy}] {line}", end="", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"OMP_WAIT_POLICY={policy} child exited {proc.returncode}")
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        raise SystemExit(f"OMP_WAIT_POLICY={policy} child: last line is not JSON: "
                         f"{last[:200]!r}") from None
