"""data_pipelines/tf_import.py: two TensorFlows side by side are one warning line naming
them and the commands that keep one; TensorFlow's start-up notices are not printed."""

import os
import subprocess
import sys
from pathlib import Path

from data_pipelines import tf_import

REPO = Path(__file__).resolve().parents[2]


def _dist_info(site: Path, name: str, version: str) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_two_tensorflows_on_the_path_are_named_with_the_commands_that_keep_one(tmp_path):
    site = tmp_path / "site-packages"
    _dist_info(site, "tensorflow", "2.20.0")
    _dist_info(site, "tensorflow-cpu", "2.21.0")
    _dist_info(site, "tensorflow-datasets", "4.9.10")  # not a TensorFlow
    found = tf_import.installed([str(site)])
    assert found == [("tensorflow", "2.20.0"), ("tensorflow-cpu", "2.21.0")]
    assert tf_import.duplicate_warning(found) == (
        "warning: two TensorFlows are installed, tensorflow 2.20.0 and tensorflow-cpu 2.21.0, "
        "over the same tensorflow/ folder; keep one: pip uninstall -y tensorflow-cpu && pip "
        "install --force-reinstall --no-deps tensorflow==2.20.0")


def test_one_tensorflow_is_no_warning_and_an_earlier_path_entry_wins(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _dist_info(first, "tensorflow-cpu", "2.22.0")
    _dist_info(second, "tensorflow-cpu", "2.21.0")
    found = tf_import.installed([str(first), str(second)])
    assert found == [("tensorflow-cpu", "2.22.0")]
    assert tf_import.duplicate_warning(found) is None
    assert tf_import.installed([str(tmp_path / "empty")]) == []


def test_without_tensorflow_itself_the_first_found_is_kept(tmp_path):
    _dist_info(tmp_path, "tensorflow-gpu", "2.20.0")
    _dist_info(tmp_path, "tf-nightly", "2.23.0.dev1")
    line = tf_import.duplicate_warning(tf_import.installed([str(tmp_path)]))
    assert line.endswith("pip uninstall -y tf-nightly && pip install --force-reinstall "
                         "--no-deps tensorflow-gpu==2.20.0"), line


def test_importing_the_data_layer_prints_the_warning_once_and_no_start_up_notices(tmp_path):
    # This venv's own TensorFlow and a second one's metadata ahead of it on the path.
    assert len(tf_import.installed()) == 1
    _dist_info(tmp_path, "tf-nightly", "2.23.0")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    done = subprocess.run(
        [sys.executable, "-c", "import sys; print('before', file=sys.stderr); "
         "import data_pipelines.tf_import; import tensorflow as tf; "
         "print(int(tf.constant(2) + 1))"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3\n"
    lines = done.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("warning: two TensorFlows")]
    assert len(warnings) == 1 and "tf-nightly 2.23.0" in warnings[0], lines
    assert lines[0] == "before", lines  # the import keeps what was written before it
    for notice in ("oneDNN", "absl::InitializeLog", "cpu_feature_guard", "rebuild TensorFlow"):
        assert not [line for line in lines if notice in line], (notice, lines)
