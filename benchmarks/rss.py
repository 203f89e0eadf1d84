"""What the ``*_rss.py`` benchmarks share: the repository on ``sys.path``, quiet CPU-only
JAX/TensorFlow defaults (set on import, before either loads), and the RSS readings."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def rss_now() -> int:
    """This process's resident set now, bytes (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss() -> int:
    """This process's peak resident set so far, bytes (``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
