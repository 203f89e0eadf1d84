"""gs:// everywhere, against a real GCS emulator configured by STORAGE_EMULATOR_HOST alone.

The emulator (``gcs_emulator`` in tests/conftest.py) serves from a thread of this process;
CLI runs in subprocesses get only ``STORAGE_EMULATOR_HOST=localhost:PORT`` of it. Every
test runs in a fresh current directory and checks that nothing landed in a local folder
named ``gs:`` (what ``pathlib.Path("gs://bucket/x")`` would make of a URI).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core import metric_log, storage

BUCKET = "gs://test-bucket"
DERIVED = (storage.TENSORSTORE_URL_ENV, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "EPATH_USE_TF")
"""What ``storage.configure`` sets from ``STORAGE_EMULATOR_HOST``."""


@pytest.fixture(autouse=True)
def _no_local_gs_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    assert not (tmp_path / "gs:").exists(), "a gs:// URI was written as a local folder"
    assert not (Path(__file__).resolve().parents[2] / "gs:").exists()


def _objects(prefix: str) -> list[str]:
    """Object names under ``gs://test-bucket/<prefix>`` (fresh listing, no cache)."""
    import fsspec

    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    return sorted(p.split("/", 1)[1] for p in fs.find(f"{BUCKET}/{prefix}"))


def _params(workdir, load):
    model = load(workdir)
    return model, {jax.tree_util.keystr(k): np.asarray(v)
                   for k, v in jax.tree_util.tree_leaves_with_path(model.params)}


def _assert_same_params(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def _kill_after_first_checkpoint(gcs_emulator, cmd, run: str, tmp_path) -> list[int]:
    """Starts ``cmd`` (a CLI train into ``gs://test-bucket/<run>``), holds its first request
    for checkpoint 2 once checkpoint 1 is committed, SIGKILLs it there; returns the
    committed steps it left."""
    gate = gcs_emulator.pause(at=f"{run}/checkpoints/2",
                              after=f"{run}/checkpoints/1/commit_success.txt")
    log = tmp_path / "killed.log"
    # The run gets the emulator as a user sets it, without what configure() derived here.
    env = {k: v for k, v in os.environ.items() if k not in DERIVED}
    env[storage.EMULATOR_ENV] = gcs_emulator.host  # host:port, no scheme
    # Its compilations land in this process's persistent cache, which the in-process
    # resume then reads instead of compiling the same step again.
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env=env)
        try:
            while not gate["reached"].wait(timeout=0.2):
                if proc.poll() is not None:
                    raise AssertionError(f"the run ended (rc {proc.returncode}) before "
                                         f"checkpoint 2:\n{log.read_text()[-3000:]}")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            gcs_emulator.clear_gates()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # A step is committed on GCS when its commit_success.txt exists (orbax writes it last).
    parts = [n.split("/") for n in _objects(f"{run}/checkpoints")]
    return sorted(int(p[2]) for p in parts
                  if len(p) == 4 and p[2].isdigit() and p[3] == "commit_success.txt")


# --------------------------------------------------------------------- paths and files


def test_as_path_keeps_uris_and_refuses_what_would_become_a_local_folder():
    path = storage.as_path("gs://b/run") / "checkpoints"
    assert os.fspath(path) == "gs://b/run/checkpoints" and storage.is_remote(path)
    assert storage.display("gs://b/run") == "gs://b/run"
    assert storage.display("rel") == str(Path("rel").resolve())
    with pytest.raises(ValueError, match=r"gs:/b/run: not a gs:// URI .* write gs://b/run"):
        storage.as_path(str(Path("gs://b/run")))  # what pathlib makes of the URI
    with pytest.raises(ValueError, match="only local paths and gs:// URIs"):
        storage.as_path("s3://b/run")
    with pytest.raises(ValueError, match="needs a bucket"):
        storage.as_path("gs:///run")


def test_emulator_host_alone_configures_every_layer(monkeypatch):
    monkeypatch.setenv(storage.EMULATOR_ENV, "127.0.0.1:1234")
    monkeypatch.delenv(storage.TENSORSTORE_URL_ENV, raising=False)
    storage.configure()
    assert os.environ[storage.TENSORSTORE_URL_ENV] == "http://127.0.0.1:1234"
    assert os.environ[storage.EMULATOR_ENV] == "http://127.0.0.1:1234"
    assert os.environ["EPATH_USE_TF"] == "false"
    monkeypatch.undo()
    storage.configure()


def test_gcsfs_retry_logs_lose_their_tracebacks_only():
    import logging

    from embedding_core import cli

    try:
        raise OSError("Cannot connect to host storage.googleapis.com:443")
    except OSError:
        exc = sys.exc_info()
    records = [logging.LogRecord(name, logging.ERROR, "f.py", 1, "out of retries", (), exc)
               for name in ("gcsfs.retry", "embedding_core.training")]
    assert all(cli._drop_storage_traceback(r) for r in records)  # every line is kept
    assert records[0].exc_info is None and records[1].exc_info is exc


def test_files_configs_and_copies_on_gs(gcs_emulator, tmp_path, monkeypatch):
    from embedding_core import checkpoints, cli, configs, files, training

    files.write_json(f"{BUCKET}/files/a.json", {"x": [1, 2]})
    assert files.read_json_object(f"{BUCKET}/files/a.json") == {"x": [1, 2]}
    files.write_lines(f"{BUCKET}/files/lines.txt", ["one", "two"])
    assert storage.as_path(f"{BUCKET}/files/lines.txt").read_text() == "one\ntwo\n"
    with pytest.raises(FileNotFoundError, match="gs://test-bucket/files/none.json not found"):
        files.read_json_object(f"{BUCKET}/files/none.json")

    config = configs.base()
    configs.save_config(config, f"{BUCKET}/files/run")
    configs.check_resume(config, f"{BUCKET}/files/run")  # same settings: accepted
    config.seed = 7
    with pytest.raises(ValueError, match="seed=42 -> 7"):
        configs.check_resume(config, f"{BUCKET}/files/run")
    back = configs.read_config(f"{BUCKET}/files/run", configs.base, prog="x")
    assert back.seed == 42
    assert os.fspath(training.check_workdir(f"{BUCKET}/files/run")) == f"{BUCKET}/files/run"
    with pytest.raises(NotADirectoryError, match="exists and is not a folder"):
        training.check_workdir(f"{BUCKET}/files/a.json")
    manager = checkpoints.make_manager(f"{BUCKET}/files/run/checkpoints", async_save=False)
    assert os.fspath(manager.directory) == f"{BUCKET}/files/run/checkpoints"  # not resolved
    manager.close()

    # --config=gs://...: the Python file is copied into the cache, ":ARG" kept.
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "flags_cache"))
    storage.as_path(f"{BUCKET}/flags/cfg.py").write_text("def get_config(arg): ...\n")
    local, _, arg = cli._local_config(f"{BUCKET}/flags/cfg.py:small").rpartition(":")
    assert arg == "small" and Path(local).read_text() == "def get_config(arg): ...\n"

    # A folder copied into a local cache, fetched again only when an object changes.
    cache = tmp_path / "cache"
    local = storage.local_copy(f"{BUCKET}/files", cache=cache)
    assert local == cache / "test-bucket" / "files"
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) \
        == ["a.json", "lines.txt", "run/run_config.json"]
    files.write_json(f"{BUCKET}/files/a.json", {"x": 3})
    storage.local_copy(f"{BUCKET}/files/a.json", cache=cache)
    assert json.loads((local / "a.json").read_text()) == {"x": 3}

    # TensorBoard's local folder, uploaded on sync; unchanged files are not sent again.
    mirror = storage.MirroredFolder(f"{BUCKET}/files/tb")
    (mirror.local / "events.1").write_bytes(b"abc")
    assert mirror.sync() == ["events.1"] and mirror.sync() == []
    with open(mirror.local / "events.1", "ab") as f:
        f.write(b"def")
    mirror.close()
    assert storage.as_path(f"{BUCKET}/files/tb/events.1").read_bytes() == b"abcdef"
    assert not mirror.local.exists()


def test_export_to_gs_round_trips_and_a_failed_export_leaves_nothing(gcs_emulator):
    from embedding_core.export import ExportFolder
    from embedding_core.export_reader import load_export

    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    ids = ["a", "b", "c"]
    meta = {"model": "m", "config": {}, "step": 1, "normalized": False,
            "similarity": "cosine"}
    with ExportFolder(f"{BUCKET}/export") as folder:
        folder.view("v", [(ids, vectors)], num_rows=3, dim=4, meta=meta)
    got, got_ids, got_meta = load_export(f"{BUCKET}/export")["v"]
    np.testing.assert_array_equal(got, vectors)
    assert got_ids == ids and got_meta["step"] == 1
    with pytest.raises(ValueError, match="not finite"), ExportFolder(f"{BUCKET}/bad") as folder:
        folder.view("v", [(ids, vectors * np.nan)], num_rows=3, dim=4, meta=meta)
    assert _objects("bad") == []


def test_model_folder_on_gs_loads_like_the_local_one(gcs_emulator, tiny_bert_dir, tmp_path,
                                                     monkeypatch):
    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.pretrained import load_pretrained

    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        storage.upload(tiny_bert_dir / name, f"{BUCKET}/models/tiny/{name}")
    remote = load_pretrained(f"{BUCKET}/models/tiny")
    local = load_pretrained(tiny_bert_dir)
    assert remote.model_dir == tmp_path / "cache" / "gcs" / "test-bucket" / "models" / "tiny"
    assert remote.config == local.config
    jax.tree.map(np.testing.assert_array_equal, remote.params, local.params)
    text = "a river and a castle"
    assert load_tokenizer(f"{BUCKET}/models/tiny").encode(text).ids == \
        load_tokenizer(tiny_bert_dir).encode(text).ids


# --------------------------------------------------------------------- training runs


@pytest.mark.slow
def test_dualcse_on_gs_killed_resumed_exported(gcs_emulator, dualcse_tiny_run, tmp_path):
    """Train 3 steps into gs://, SIGKILL after checkpoint 1, resume: the parameters of an
    uninterrupted run (the session's shared run of the same config, tests/shared_runs.py,
    whose compiled step the CLI and the resume read from the compile cache); export to
    gs:// and read it back with load_export."""
    from dualcse_jax import load, workflows
    from dualcse_jax.configs import DATA_FILES, default
    from embedding_core.export_reader import load_export
    from embedding_core.storage import absolute_data_paths

    assert dualcse_tiny_run.overrides["num_train_steps"] == 3
    # Checkpoints at every step (kept): where the run saves does not change its parameters.
    over = dict(dualcse_tiny_run.overrides, checkpoint_every=1, keep_checkpoints=3)
    cmd = [sys.executable, "-m", "dualcse_jax.main", "train", f"--workdir={BUCKET}/dual"] + \
        [f"--config.{k}={v}" for k, v in over.items()]
    assert _kill_after_first_checkpoint(gcs_emulator, cmd, "dual", tmp_path) == [1]

    # The CLI saves data paths made absolute; the same config resumes in this process.
    config = absolute_data_paths(default.get_config(), DATA_FILES)
    config.update(over)
    workflows.train(config, f"{BUCKET}/dual")  # resume
    model, resumed = _params(f"{BUCKET}/dual", load)
    _, reference = _params(dualcse_tiny_run.workdir, load)  # uninterrupted
    assert model.step == 3
    _assert_same_params(resumed, reference)
    names = _objects("dual")
    assert "dual/run_config.json" in names and any("/events.out.tfevents" in n for n in names)
    # The killed run's rows up to its checkpoint were uploaded with it; the resume adds 2, 3.
    rows = metric_log.read_metrics(f"{BUCKET}/dual")
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]
    png = storage.as_path(f"{BUCKET}/dual/{metric_log.PLOT_FILE}").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert {"dual/encoder/config.json", "dual/encoder/tokenizer.json"} <= set(names)

    texts = ["A man is playing a guitar.", "The lawn was littered with toys."]
    storage.as_path(f"{BUCKET}/sentences.txt").write_text("\n".join(texts) + "\n")
    workflows.export_workdir(f"{BUCKET}/dual", f"{BUCKET}/sentences.txt", f"{BUCKET}/out")
    views = load_export(f"{BUCKET}/out")
    assert sorted(views) == ["explicit", "implicit"]
    for kind, (vectors, ids, meta) in views.items():
        assert ids == texts and meta["step"] == 3
        assert meta["workdir"] == f"{BUCKET}/dual"
        np.testing.assert_allclose(vectors, model.encode(texts, kind=kind), atol=1e-5)


@pytest.mark.slow
def test_docent_on_gs_killed_resumed_exported(gcs_emulator, docent_tiny_run, tmp_path):
    """The same for DocEnt, its training documents read from gs:// as well (the shared
    run, tests/shared_runs.py, trained on a local copy of them, is the reference)."""
    from docent_jax import load, trainer, workflows
    from docent_jax.configs import default
    from embedding_core.export_reader import load_export
    from tests.shared_runs import DOCENT_DOCS, DOCENT_WORDS

    storage.as_path(f"{BUCKET}/docs.jsonl").write_text(DOCENT_DOCS)
    assert docent_tiny_run.overrides["num_train_steps"] == 3
    over = dict(docent_tiny_run.overrides, train_file=f"{BUCKET}/docs.jsonl",
                checkpoint_every=1, keep_checkpoints=3)
    cmd = [sys.executable, "-m", "docent_jax.main", "train", f"--workdir={BUCKET}/docent"] + \
        [f"--config.{k}={v}" for k, v in over.items()]
    assert _kill_after_first_checkpoint(gcs_emulator, cmd, "docent", tmp_path) == [1]

    config = default.get_config()
    config.update(over)  # no local data path: what the CLI saved
    trainer.train(config, f"{BUCKET}/docent")  # resume
    ranker, resumed = _params(f"{BUCKET}/docent", load)
    _, reference = _params(docent_tiny_run.workdir, load)  # uninterrupted
    assert ranker.step == 3 and ranker.entity_ids == [f"E_{w}" for w in sorted(DOCENT_WORDS)]
    _assert_same_params(resumed, reference)
    assert storage.as_path(f"{BUCKET}/docent/entity_ids.txt").read_text().split() == \
        ranker.entity_ids

    queries = ["which one has a river?", "an old castle"]
    storage.as_path(f"{BUCKET}/queries.txt").write_text("\n".join(queries) + "\n")
    workflows.export_workdir(f"{BUCKET}/docent", f"{BUCKET}/docent_out",
                             input_path=f"{BUCKET}/queries.txt")
    views = load_export(f"{BUCKET}/docent_out")
    entities, ids, meta = views["entities"]
    assert ids == ranker.entity_ids and meta["step"] == 3
    np.testing.assert_allclose(entities, ranker.entity_embeddings(), rtol=1e-5, atol=1e-5)
    vectors, ids, _ = views["queries"]
    assert ids == queries
    np.testing.assert_allclose(vectors, ranker.encode(queries), rtol=1e-5, atol=1e-5)
