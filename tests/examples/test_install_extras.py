"""The install contract of pyproject.toml: no TensorFlow in the base dependencies, each
accelerator extra brings jax and tensorflow-cpu, and without TensorFlow the data pipeline
stops with one line naming them (data_pipelines/tf_import.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements]


def test_tensorflow_comes_from_the_environment_or_an_extra():
    assert not [n for n in _names(PROJECT["dependencies"]) if n.startswith("tensorflow-")
                and n != "tensorflow-datasets" or n == "tensorflow"]
    extras = PROJECT["optional-dependencies"]
    for extra, jax in (("cpu", "jax>="), ("tpu", "jax[tpu]>="), ("cuda12", "jax[cuda12]>="),
                       ("cuda13", "jax[cuda13]>=")):
        assert sorted(_names(extras[extra])) == ["jax", "tensorflow-cpu"], extra
        assert any(r.startswith(jax) for r in extras[extra]), extra


def test_without_tensorflow_the_data_pipeline_says_what_to_install():
    for module in ("data_pipelines.pipeline", "data_pipelines.tfds_builders"):
        done = subprocess.run(
            [sys.executable, "-c", "import sys; sys.modules['tensorflow'] = None; "
             f"import {module}"], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            "ModuleNotFoundError: TensorFlow is not installed; the data pipeline (tf.data, "
            "TFDS) needs it: install this project with an extra (pip install -e "
            "'PROJECT_FOLDER[cpu]', or [tpu], [cuda12], [cuda13]), or pip install "
            "'tensorflow>=2.20,<2.24'"), module
