"""The tfds builders of the shipped sets, and the package's import weight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

import data_pipelines.tfds_builders as builders  # noqa: E402


def test_inli_through_tfds(tmp_path):
    test = tfds.load("inli", split="test", data_dir=tmp_path)
    examples = list(test.as_numpy_iterator())
    assert len(examples) == 1000
    first = examples[0]
    assert first["premise"].decode().startswith("A wave of whispers followed Mrs. Lopez")
    assert first["implied_entailment"].decode() == (
        "Mrs. Lopez's neighbors dislike how she neglects her property's upkeep."
    )
    assert first["dataset"] == b"normbank"
    info = tfds.builder("inli", data_dir=tmp_path).info
    assert info.splits["train"].num_examples == 8000
    assert info.splits["validation"].num_examples == 1000


class _NoDownloads:
    def __getattr__(self, name):
        raise AssertionError(f"the builder used the download manager ({name})")


def test_split_generators_fetch_nothing(tmp_path):
    builder = builders.SnliTriplets(data_dir=tmp_path)
    splits = builder._split_generators(_NoDownloads())
    assert list(splits) == ["train"]
    key, example = next(iter(splits["train"]))
    assert key == 2 and example["sent1"] == "A person is outdoors, on a horse."


def test_import_is_light():
    code = (
        "import sys, data_pipelines, data_pipelines.inli, data_pipelines.snli, "
        "data_pipelines.impscore, data_pipelines.tokenization, data_pipelines.table, "
        "dualcse_jax.tables; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
        "assert 'flax' not in sys.modules and 'jax' not in sys.modules"
    )
    # Run from the repository root so a source checkout imports without an install.
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
