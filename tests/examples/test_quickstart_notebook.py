"""examples/quickstart.ipynb runs top to bottom: in a kernel of this environment (its install
cell skips), and in a fresh venv that holds Colab's kind of stack, where its install cell
installs this folder (``make test-notebook``)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
KERNEL = "embedding-jax-test"
# What the fresh venv holds before the install cell: Colab's kind of runtime, with the full
# `tensorflow` (not -cpu) and a jax older than this venv's.
RUNTIME = os.environ.get("EMBEDDING_JAX_NOTEBOOK_RUNTIME",
                         "tensorflow==2.20.0 jax==0.7.2 jaxlib==0.7.2").split()
TENSORFLOW_DISTS = re.compile(r"(tensorflow([-_](cpu|gpu|intel|macos))?|tf[-_]nightly.*)",
                              re.IGNORECASE)


def _kernel_env() -> dict[str, str]:
    """The kernel sees what a user's Python sees: one CPU device (not the suite's 8 fake
    ones), the suite's compile cache (reruns compile less)."""
    env = dict(os.environ)
    suite_only = ("xla_force_host_platform_device_count", "xla_llvm_disable_expensive_passes",
                  "xla_backend_optimization_level")  # tests/conftest.py's
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not any(name in f for name in suite_only)]
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("JAX_COMPILATION_CACHE_DIR",
                   os.environ.get("JAX_TEST_CACHE", str(REPO / ".cache" / "jax")))
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _run_notebook(python: Path | str, tmp_path: Path, monkeypatch, env: dict[str, str]
                  ) -> tuple[list[str], Path]:
    """Runs the notebook in a kernel of ``python``; returns each code cell's stdout and the
    folder it ran in."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "embedding-jax (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    work = tmp_path / "run"
    work.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=1800,
                                     resources={"metadata": {"path": str(work)}})
    try:
        client.execute(env=env)
    finally:
        for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            print(f"--- cell {i} stdout ---\n{_stdout(cell)}", flush=True)
    return [_stdout(cell) for cell in nb.cells if cell.cell_type == "code"], work


def _stdout(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream" and out.get("name") == "stdout")


def _check_run(printed: list[str], work: Path, python: Path | str) -> None:
    assert f"Python: {python}\n" in printed[1]
    assert "JAX " in printed[1] and ": 1 cpu device(s)" in printed[1]
    assert "r: (3, 384) float32" in printed[3]
    assert "same rows as encode(): True" in printed[4]
    for view in ("explicit", "implicit"):
        assert f"{view}: sentence-transformers vs load().encode" in printed[5]
    assert printed[6].count("\n    ") == 3  # each query's ranking of the four places
    assert all(place in printed[6] for place in ("bakery", "lighthouse", "observatory",
                                                 "library"))
    assert printed[-1].startswith("No TPU on this runtime (backend: cpu): TPU section skipped.")
    runs = work / "quickstart_runs"
    assert (runs / "hf" / "explicit" / "modules.json").is_file()
    assert (runs / "export" / "export.json").is_file()
    # The notebook file itself carries no outputs (they are produced here).
    assert not any(c.get("outputs") for c in nbformat.read(NOTEBOOK, as_version=4).cells
                   if c.cell_type == "code")


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    printed, work = _run_notebook(sys.executable, tmp_path, monkeypatch, _kernel_env())
    assert printed[0].startswith("embedding-jax is already installed:")  # no reinstall
    _check_run(printed, work, sys.executable)


def _pip_list(python: Path) -> dict[str, str]:
    listing = subprocess.run([python, "-m", "pip", "list", "--format=json"], check=True,
                             capture_output=True, text=True).stdout
    return {row["name"].lower().replace("_", "-"): row["version"] for row in json.loads(listing)}


def _tensorflows(listing: dict[str, str]) -> list[str]:
    return sorted(f"{name} {version}" for name, version in listing.items()
                  if TENSORFLOW_DISTS.fullmatch(name))


@pytest.mark.notebook_install
def test_install_cell_installs_this_folder_next_to_an_installed_tensorflow(tmp_path,
                                                                            monkeypatch):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    # torch first (sentence-transformers needs it): the CPU wheel on local disk (Makefile).
    for step in (["torch==2.13.0"], [*RUNTIME, "ipykernel"]):
        print("$ pip install", *step, flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *step], check=True)
    before = _pip_list(python)
    print("before the notebook:", ", ".join(_tensorflows(before)),
          "| jax", before.get("jax"), flush=True)
    assert _tensorflows(before) == [f"tensorflow {before['tensorflow']}"]
    assert "embedding-jax" not in before

    env = _kernel_env()
    env.pop("PYTHONPATH", None)  # the kernel finds the library only if the cell installs it
    env.pop("VIRTUAL_ENV", None)
    env["EMBEDDING_JAX_PACKAGE"] = str(REPO)
    printed, work = _run_notebook(python, tmp_path, monkeypatch, env)

    after = _pip_list(python)
    print("$ pip list (after)\n" + "\n".join(f"{n} {v}" for n, v in sorted(after.items())))
    kept = [f"{name}=={before[name]}" for name in ("jax", "jaxlib") if name in before]
    assert f"pip install -e {REPO} sentence-transformers | keeping: {', '.join(kept) or '-'}\n" \
        in printed[0]  # no [cpu] extra: the installed tensorflow serves
    assert "pip could not keep" not in printed[0]
    assert f"embedding-jax 0.1.0 installed from {REPO.as_uri()}\n" in printed[0]
    assert f"TensorFlow: tensorflow {before['tensorflow']}\n" in printed[0]
    assert _tensorflows(after) == [f"tensorflow {before['tensorflow']}"]  # one, the same
    assert all(after[name] == before[name] for name in ("jax", "jaxlib") if name in before)
    assert after["embedding-jax"] == "0.1.0"
    _check_run(printed, work, python)
