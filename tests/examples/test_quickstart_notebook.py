"""examples/quickstart.ipynb runs top to bottom in a kernel of this environment's Python."""

import json
import os
import sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
KERNEL = "embedding-jax-test"


def _kernel_env() -> dict[str, str]:
    """The kernel sees what a user's Python sees: one CPU device (not the suite's 8 fake
    ones), the suite's compile cache (reruns compile less)."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("JAX_COMPILATION_CACHE_DIR",
                   os.environ.get("JAX_TEST_CACHE", str(REPO / ".cache" / "jax")))
    env["PYTHONWARNINGS"] = "ignore"
    return env


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    # A kernel spec whose Python is this one (the venv's), whatever `python3` means here.
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "embedding-jax (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    work = tmp_path / "run"
    work.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=1800,
                                     resources={"metadata": {"path": str(work)}})
    client.execute(env=_kernel_env())

    def text(cell) -> str:
        return "".join(out.get("text", "") for out in cell.get("outputs", [])
                       if out.get("output_type") == "stream" and out.get("name") == "stdout")

    printed = [text(cell) for cell in nb.cells if cell.cell_type == "code"]
    assert printed[0].startswith("embedding-jax is already installed:")  # no reinstall
    assert f"Python: {sys.executable}\n" in printed[1]
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
