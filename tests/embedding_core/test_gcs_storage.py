"""gs:// everywhere, against a real GCS emulator configured by STORAGE_EMULATOR_HOST alone.

The emulator (``gcs_emulator`` in tests/conftest.py) serves from a thread of this process;
CLI runs in subprocesses get only ``STORAGE_EMULATOR_HOST=localhost:PORT`` of it. Every
test runs in a fresh current directory and checks that nothing landed in a local folder
named ``gs:`` (what ``pathlib.Path("gs://bucket/x")`` would make of a URI).
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.storage import storage
from embedding_core.training import metric_log

BUCKET = "gs://test-bucket"
DERIVED = (storage.TENSORSTORE_URL_ENV, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "EPATH_USE_TF",
           storage.TOKEN_ENV)
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


def _user_env(host: str, **extra: str) -> dict[str, str]:
    """This environment as a user's shell has it: ``STORAGE_EMULATOR_HOST=host`` (or unset
    for ``host=""``), nothing ``storage.configure`` derived, this process's compile cache."""
    env = {k: v for k, v in os.environ.items() if k not in DERIVED}
    env.pop(storage.EMULATOR_ENV, None)
    if host:
        env[storage.EMULATOR_ENV] = host
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    return dict(env, **extra)


def _dualcse(env: dict, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dualcse_jax.main", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=1800)


@pytest.fixture
def dualcse(cli, monkeypatch):
    """``dualcse(env, *args)``: ``dualcse-jax ARGS`` with ``env`` (``_user_env``), in this
    process (its storage checks forgotten first) and, in the slow tier, as a child process
    (``_dualcse``)."""
    from tests import in_process

    def run(env: dict, *args: str):
        if cli is in_process.run_subprocess:
            return _dualcse(env, *args)
        monkeypatch.setattr(storage, "_checked", set())
        done = cli("dualcse_jax.main", *args, env=env)
        # The session's emulator serves from this process: its request lines are not the
        # command's.
        done.stderr = "".join(line for line in done.stderr.splitlines(keepends=True)
                              if not re.match(r"I\d{4} .* server\.py:\d+\] \"", line))
        return done

    return run


def _error_lines(text: str) -> list[str]:
    """absl/glog error-level lines (``E1204 10:00:00...``) and traceback headers."""
    return [line for line in text.splitlines()
            if (line[:1] in "EF" and line[1:5].isdigit()) or line.startswith("Traceback")]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


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
               for name in ("gcsfs.retry", "embedding_core.training.training")]
    assert all(cli._drop_storage_traceback(r) for r in records)  # every line is kept
    assert records[0].exc_info is None and records[1].exc_info is exc


def test_files_configs_and_copies_on_gs(gcs_emulator, tmp_path, monkeypatch):
    from embedding_core import cli, configs
    from embedding_core.storage import files
    from embedding_core.training import checkpoints, training

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
    from embedding_core.serving.export import ExportFolder
    from embedding_core.serving.export_reader import load_export

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
    from embedding_core.models.pretrained import load_pretrained

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
    from embedding_core.serving.export_reader import load_export
    from embedding_core.storage.storage import absolute_data_paths

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
    from embedding_core.serving.export_reader import load_export
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


# --------------------------------------------------------------------- endpoints and errors


def test_gcsfs_paths_in_errors_become_uris():
    assert storage.describe_error(FileNotFoundError("b/bkt/o/dir%2Fnope.jsonl")) == \
        "gs://bkt/dir/nope.jsonl does not exist"
    assert storage.describe_error(OSError("Forbidden: b/bkt/o\nForbidden")) == \
        "Forbidden: gs://bkt\nForbidden"
    assert storage.describe_error(OSError("GET http://h/storage/v1/b/bkt/o/x: 500")) == \
        "GET http://h/storage/v1/b/bkt/o/x: 500"  # a URL stays as it is


def test_missing_remote_data_paths_name_their_field(gcs_emulator):
    from dualcse_jax.configs import default

    storage.as_path(f"{BUCKET}/data/pairs.csv").write_text("premise\n")
    for field in ("train_file", "val_file", "train_shards"):
        config = default.get_config()
        config[field] = f"{BUCKET}/data/pairs.csv,{BUCKET}/data/nope.jsonl"
        with pytest.raises(FileNotFoundError) as err:
            storage.check_data_paths(config, ("train_file", "val_file", "train_shards"))
        assert str(err.value) == f"config.{field}: {BUCKET}/data/nope.jsonl does not exist"
        config[field] = f"{BUCKET}/data/pairs.csv"
        storage.check_data_paths(config, (field,))  # present: accepted


def test_missing_remote_val_file_is_one_line(gcs_emulator, tmp_path, dualcse):
    proc = dualcse(_user_env(gcs_emulator.host), "train", f"--workdir={BUCKET}/nofile",
                    f"--config.val_file={BUCKET}/nope.jsonl")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"dualcse-jax train: error: config.val_file: {BUCKET}/nope.jsonl does not exist"]
    assert _objects("nofile") == []


def test_an_unreachable_emulator_is_one_line_within_the_stated_bound(monkeypatch, dualcse):
    port = _closed_port()
    monkeypatch.setattr(storage, "_checked", set())
    monkeypatch.setenv(storage.EMULATOR_ENV, f"localhost:{port}")
    monkeypatch.setenv(storage.TIMEOUT_ENV, "0.5")
    with pytest.raises(storage.StorageUnavailableError) as err:
        storage.check_endpoint(["/local/first", "gs://b/run"])
    assert str(err.value) == (
        f"gs://b/run: nothing answers at http://localhost:{port} (STORAGE_EMULATOR_HOST) "
        "within 0.5 s (Connection refused); start an emulator there (python -m "
        f"embedding_core.storage.gcs_emulator --port={port}), or unset STORAGE_EMULATOR_HOST "
        "to use "
        "Google Cloud Storage")
    storage.check_endpoint(["/local/only"])  # no gs:// path: nothing to reach

    # The CLI: the same line alone, exit 1, before anything is written.
    proc = dualcse(_user_env(f"localhost:{port}", **{storage.TIMEOUT_ENV: "1"}), "train",
                    "--workdir=gs://b/run")
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("dualcse-jax train: error: gs://b/run: nothing answers at "
                                  f"http://localhost:{port} (STORAGE_EMULATOR_HOST) within 1 s")


def test_google_storage_without_credentials_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(storage, "_checked", set())
    monkeypatch.delenv(storage.EMULATOR_ENV, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login here
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # nor a VM's service account
    with pytest.raises(storage.StorageUnavailableError) as err:
        storage.check_endpoint(["gs://b/run"])
    assert str(err.value) == (
        "gs://b/run: no Google Cloud credentials; run `gcloud auth application-default "
        "login` or set GOOGLE_APPLICATION_CREDENTIALS=KEY.json (for a local emulator "
        "instead: python -m embedding_core.storage.gcs_emulator, then "
        "STORAGE_EMULATOR_HOST=localhost:PORT)")


def test_google_storage_out_of_reach_is_one_line_within_the_stated_bound(monkeypatch,
                                                                         tmp_path):
    creds = tmp_path / "adc.json"  # parsed without a request; never used to sign in
    creds.write_text(json.dumps({"type": "authorized_user", "client_id": "i",
                                 "client_secret": "s", "refresh_token": "r"}))
    monkeypatch.setattr(storage, "_checked", set())
    monkeypatch.setattr(storage, "GCS_HOST", "storage.invalid")  # never resolves (RFC 2606)
    monkeypatch.delenv(storage.EMULATOR_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.setenv(storage.TIMEOUT_ENV, "0.5")
    for proxy in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with pytest.raises(storage.StorageUnavailableError, match=(
            r"^gs://b/run: cannot reach storage.invalid:443 within 0.5 s \(.+\); check the "
            r"network \(\$EMBEDDING_JAX_GCS_TIMEOUT sets the wait\), or set "
            r"STORAGE_EMULATOR_HOST=localhost:PORT for a local emulator \(python -m "
            r"embedding_core.storage.gcs_emulator\)$")):
        storage.check_endpoint(["gs://b/run"])


def _start(cmd: list[str], ready: str, env=None) -> tuple[subprocess.Popen, str]:
    """Starts a server process; returns it with its output up to the line containing
    ``ready``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            return proc, "".join(seen)
    proc.wait()
    raise AssertionError(f"{cmd} ended (rc {proc.returncode}): {''.join(seen)[-2000:]}")


@pytest.mark.slow
def test_the_stock_emulator_is_refused_and_the_shipped_one_accepted(monkeypatch):
    """gcp-storage-emulator as it installs (no object generations) is refused at the start
    of a run in one line naming the shipped command, which then passes the same check."""
    port = _closed_port()
    stock, _ = _start([sys.executable, "-m", "gcp_storage_emulator", "start",
                       f"--port={port}", "--in-memory", "--default-bucket=b"],
                      ready="All services started")
    try:
        proc = _dualcse(_user_env(f"localhost:{port}"), "train", "--workdir=gs://b/run")
    finally:
        stock.terminate()
        stock.wait()
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"dualcse-jax train: error: gs://b/run: the GCS emulator at http://localhost:{port} "
        "(STORAGE_EMULATOR_HOST) sends no object generation (x-goog-generation) with a "
        "download, which orbax's checkpoint writer needs (the stock gcp-storage-emulator "
        "does not keep them); serve gs:// with python -m embedding_core.storage.gcs_emulator "
        f"--port={port} instead"]

    shipped, banner = _start([sys.executable, "-m", "embedding_core.storage.gcs_emulator",
                              f"--port={port}", "--bucket=b", "--bucket=c"],
                             ready="STORAGE_EMULATOR_HOST=")
    try:
        assert banner.strip() == (f"GCS emulator on http://localhost:{port}, buckets gs://b, "
                                  f"gs://c; in another shell: export "
                                  f"STORAGE_EMULATOR_HOST=localhost:{port}")
        monkeypatch.setattr(storage, "_checked", set())
        monkeypatch.setenv(storage.EMULATOR_ENV, f"http://localhost:{port}")
        storage.check_endpoint(["gs://c/run"])  # accepted
        monkeypatch.setattr(storage, "_checked", set())
        with pytest.raises(storage.StorageUnavailableError, match=(
                f"gs://nob/run: the GCS emulator at http://localhost:{port} "
                r"\(STORAGE_EMULATOR_HOST\) has no bucket 'nob'; start it with python -m "
                f"embedding_core.storage.gcs_emulator --port={port} --bucket=nob$")):
            storage.check_endpoint(["gs://nob/run"])
    finally:
        shipped.send_signal(signal.SIGTERM)
        rest = shipped.communicate(timeout=60)[0]
    assert shipped.returncode == 0 and rest.strip() == f"GCS emulator on localhost:{port} stopped"


@pytest.mark.slow
def test_gs_run_logs_no_errors_and_a_failed_checkpoint_write_is_one_line(
        gcs_emulator, dualcse_tiny_run, tmp_path):
    """A 2-step CLI run into gs:// prints no error-level line and one readahead-cache line;
    its resume to step 3, whose checkpoint the emulator refuses (403), ends in one line
    naming the folder and the storage error, exit 1, and checkpoint 2 still loads."""
    from dualcse_jax import load

    over = dict(dualcse_tiny_run.overrides, num_train_steps=2, checkpoint_every=1)
    args = ["train", f"--workdir={BUCKET}/fails"] + \
        [f"--config.{k}={v}" for k, v in over.items()]
    env = _user_env(gcs_emulator.host)
    ok = _dualcse(env, *args, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert _error_lines(ok.stderr) == []
    assert sum("AdaptiveReadaheadCache" in line for line in ok.stderr.splitlines()) == 1

    gcs_emulator.fail(at="fails/checkpoints/3/params/ocdbt")
    try:
        failed = _dualcse(env, *args, "--config.num_train_steps=3", cwd=tmp_path)
    finally:
        gcs_emulator.clear_faults()
    assert failed.returncode == 1
    assert _error_lines(failed.stderr) == []
    assert failed.stderr.splitlines()[-1] == (
        f"dualcse-jax train: error: {BUCKET}/fails/checkpoints/3: checkpoint write failed: "
        f"PERMISSION_DENIED: {BUCKET}/fails/checkpoints/3/params/ocdbt.process_0/"
        f"manifest.ocdbt: Forbidden; step 2 in {BUCKET}/fails/checkpoints is the latest "
        "complete checkpoint: the same command resumes from it")
    model = load(f"{BUCKET}/fails")
    assert model.step == 2


def test_a_uri_without_a_bucket_is_its_own_error_before_any_endpoint_check():
    with pytest.raises(ValueError, match=r"^gs:///x.csv: a gs:// URI needs a bucket"):
        storage.check_endpoint(["/local/dir", "gs:///x.csv"])


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """Google Cloud Storage, no emulator, no credentials: the start check's first refusal."""
    monkeypatch.setattr(storage, "_checked", set())
    monkeypatch.delenv(storage.EMULATOR_ENV, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login here
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # nor a VM's service account
    return ("gs://b/dev.csv: no Google Cloud credentials; run `gcloud auth "
            "application-default login`")


def test_eval_files_over_gs_get_the_start_check(no_credentials, tmp_path):
    from embedding_core import commands, configs
    from embedding_core.training.run import run
    from tests.embedding_core.test_run import _config, _make_task

    config = _config(eval_every=6, eval_files="sts:gs://b/dev.csv")
    with pytest.raises(storage.StorageUnavailableError) as err:
        run(_make_task([]), config, tmp_path / "run")
    assert str(err.value).startswith(no_credentials) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()

    class Given(dict):  # what the trainers' CLI hands _paths_given: absl FLAGS
        workdir, output, input = "/w", None, None
        config = configs.base()

    given = Given({kind: type("Flag", (), {"value": []}) for kind in commands.evaluation.KINDS})
    given.config.eval_files = r"sts:gs://b/dev.csv, ir:/data/beir\,v2, pairs:p.csv"
    paths = commands._paths_given(given)
    assert paths[:4] == ["/w", "gs://b/dev.csv", "/data/beir,v2", "p.csv"]


def test_embedding_jax_encode_and_evaluate_get_the_start_check(no_credentials, capsys):
    from embedding_core import main
    from embedding_core.evaluation import cli

    assert cli.main(["--model=org/model", "--sts=gs://b/dev.csv"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"embedding-jax evaluate: error: {no_credentials}")
    storage._checked.clear()
    assert main.main(["encode", "--model=org/model", "--input", "gs://b/dev.csv",
                      "--output=/tmp/out"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"embedding-jax encode: error: {no_credentials}")


def test_a_bucket_is_not_a_data_file(gcs_emulator):
    import ml_collections

    from embedding_core.evaluation import run as evaluation
    from embedding_core.training import data_fingerprint
    from embedding_core.training.run import _eval_files
    from tests.embedding_core.test_run import _config

    storage.write_bytes(f"{BUCKET}/x.csv", b"a,b\n")  # a bucket with a file is still one
    for uri in (f"{BUCKET}/", BUCKET, f"{BUCKET}//"):
        config = ml_collections.ConfigDict({"train_file": uri})
        want = (f"config.train_file: {uri} is a bucket, not a file; name a file (or folder) "
                f"in it: {BUCKET}/PATH")
        for check in (storage.check_data_paths, data_fingerprint.fingerprint):
            with pytest.raises(ValueError) as err:
                check(config, ["train_file"])
            assert str(err.value) == want
    with pytest.raises(ValueError, match=rf"^config.eval_files: {BUCKET}/ is a bucket, not a "
                       "file; "):
        _eval_files(_config(eval_every=6, eval_files=f"ir:{BUCKET}/"))
    with pytest.raises(ValueError, match=rf"^--sts {BUCKET} is a bucket, not a file; "):
        evaluation.build_all(evaluation.parse({"sts": [BUCKET]}))
