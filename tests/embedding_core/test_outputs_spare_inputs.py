"""The after-export commands never write over their inputs, never index or quantize NaN,
and fail before writing (the break-it pass of issue 40): one line, nothing changed."""

from __future__ import annotations

import numpy as np
import pytest

from embedding_core.main import main
from embedding_core.serving import export


def _export(folder, rows):
    meta = {"model": "m", "config": {}, "step": None, "normalized": False,
            "similarity": "cosine"}
    export.export_view(folder, [([f"r{i}" for i in range(len(rows))], rows)],
                       num_rows=len(rows), dim=rows.shape[1], meta=meta, split=False)
    return folder


def _error(capsys, *names):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err, err
    for name in names:
        assert str(name) in err, err


def _snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def exports(tmp_path):
    rows = np.random.default_rng(0).normal(size=(12, 8)).astype(np.float32)
    nan = _export(tmp_path / "nan", rows)
    rows = rows.copy()
    rows[5, 3] = np.nan  # what a hand-made or damaged export holds (our writer refuses NaN)
    np.save(nan / "embeddings.npy", rows)
    return _export(tmp_path / "corpus", rows[[0]].repeat(12, 0) + np.arange(12)[:, None]), nan


def test_search_refuses_an_output_inside_its_corpus_or_on_its_queries(exports, tmp_path,
                                                                      capsys):
    corpus, _ = exports
    queries = _export(tmp_path / "q", np.ones((2, 8), np.float32))
    for output, flag in ((corpus / "meta.json", "--corpus"), (corpus, "--corpus"),
                         (queries / "ids.txt", "--queries")):
        before = _snapshot(tmp_path)
        assert main(["search", f"--corpus={corpus}", f"--queries={queries}",
                     f"--output={output}", "--top_k=3"]) == 1
        _error(capsys, f"would overwrite {flag}=")
        assert _snapshot(tmp_path) == before


def test_mining_refuses_an_output_on_its_pairs(tmp_path, capsys):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\na,b\nc,d\n")
    assert main(["mine-hard-negatives", "--model=not-needed", f"--pairs={pairs}",
                 f"--output={pairs}"]) == 1
    _error(capsys, "would overwrite --pairs=", pairs)
    assert pairs.read_text() == "anchor,positive\na,b\nc,d\n"


def test_quantize_refuses_nan_rows_and_nan_calibration(exports, tmp_path, capsys):
    corpus, nan = exports
    assert main(["quantize", f"--input={nan}", f"--output={tmp_path / 'q'}",
                 "--precision=int8", f"--calibration={corpus}"]) == 1
    _error(capsys, "row 5 (id r5)", "NaN")
    assert main(["quantize", f"--input={corpus}", f"--output={tmp_path / 'q'}",
                 "--precision=int8", f"--calibration={nan}"]) == 1
    _error(capsys, f"--calibration={nan}", "row 5")
    assert main(["quantize", f"--input={nan}", f"--output={tmp_path / 'q'}",
                 "--precision=ubinary"]) == 1
    _error(capsys, "row 5")
    assert not (tmp_path / "q").exists()


def test_index_refuses_its_input_nan_and_a_bad_seed_before_writing(exports, tmp_path, capsys):
    pytest.importorskip("faiss", reason="faiss-cpu not installed (extra `index`)")
    corpus, nan = exports
    before = _snapshot(corpus)
    assert main(["index", f"--input={corpus}", f"--output={corpus / 'embeddings.npy'}",
                 "--kind=flat"]) == 1
    _error(capsys, "would overwrite --input=")
    assert _snapshot(corpus) == before
    assert main(["index", f"--input={nan}", f"--output={tmp_path / 'i.faiss'}",
                 "--kind=flat"]) == 1
    _error(capsys, str(nan), "row 5")
    kept = tmp_path / "kept.faiss"
    kept.write_bytes(b"an index the user keeps")
    assert main(["index", f"--input={corpus}", f"--output={kept}", "--kind=flat",
                 "--seed=-1"]) == 2
    _error(capsys, "--seed")
    assert kept.read_bytes() == b"an index the user keeps"
    assert not (tmp_path / "i.faiss").exists()
