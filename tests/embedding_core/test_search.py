"""embedding-jax search: exact top-k over the mesh equals a numpy brute force (ids, scores,
ties: lower row first) on 1 and 8 devices, chunks and row blocks smaller than the corpus,
multi-part exports; the CLI's JSON Lines / TREC runs, --qrels metrics, one-line errors; the
shared two-process run's search (2 processes x 4 devices) equal to one process's."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core import main as cli_main
from embedding_core.serving import export, export_parts, search, search_cli
from embedding_core.serving.embedding_writer import FORMAT_VERSION
from tests.two_processes import SEARCH_CASES, SEARCH_NAN_ROW, search_vectors

DIM = 8
META = {"model": "test", "config": {}, "step": None, "normalized": False,
        "similarity": "cosine"}


def brute_force(q: np.ndarray, c: np.ndarray, k: int, score: str):
    """float64 scores rounded to float32; ties by lower row."""
    q, c = np.asarray(q, np.float64), np.asarray(c, np.float64)
    if score == "cos":
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    s = (q @ c.T).astype(np.float32)
    rows = np.stack([np.lexsort((np.arange(len(c)), -row))[:k] for row in s])
    return np.take_along_axis(s, rows, axis=1), rows


def vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.normal(size=(n, DIM)).astype(np.float32)
    out[5] = out[3]  # exact ties: the same row twice, and a row scaled (cos ties)
    out[n - 1] = out[3] * 2
    out[min(7, n - 2)] = 0  # a zero row scores 0 in cos
    return out


def write_export(folder: Path, rows: np.ndarray, ids: list[str] | None = None,
                 parts: int = 1) -> Path:
    ids = ids or [f"d{i}" for i in range(len(rows))]
    if parts == 1:
        export.export_view(folder, [(ids, rows)], num_rows=len(rows), dim=rows.shape[1],
                           meta=META, split=False)
        return folder
    bounds = np.linspace(0, len(rows), parts + 1).astype(int)
    listed = []
    for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        name = export_parts.part_name(p, parts)
        export.export_view(folder / name, [(ids[a:b], rows[a:b])], num_rows=int(b - a),
                           dim=rows.shape[1], meta=META, split=False)
        listed.append({"folder": name, "num_rows": int(b - a)})
    export_parts._write_manifest(folder, listed, len(rows), {"embeddings": rows.shape[1]},
                                 np.float32, "ids.txt", META, FORMAT_VERSION)
    return folder


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("score", ["cos", "dot"])
def test_search_equals_brute_force(tmp_path, devices, score):
    corpus = vectors(101, 0)  # not a multiple of 8
    queries = np.concatenate([vectors(12, 1), corpus[[3, 7]]])
    folder = write_export(tmp_path / "c", corpus, parts=3)
    mesh = search.corpus_mesh(jax.local_devices()[:devices])
    want_s, want_i = brute_force(queries, corpus, 10, score)
    # rtol: dot scores reach ~20, where float32 steps are 2e-6.
    for chunk, block in ((24, 2), (1000, 0), (17, 5)):
        s, i = search.search(queries, search.Corpus(folder), 10, score=score, mesh=mesh,
                             chunk_rows=chunk, row_block=block, query_batch=5)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_allclose(s, want_s, atol=1e-6, rtol=1e-6)
    # k above a chunk's rows, and the whole corpus: every row, ranked.
    s, i = search.search(queries, corpus, 101, score=score, mesh=mesh, chunk_rows=16)
    want_s, want_i = brute_force(queries, corpus, 101, score)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(s, want_s, atol=1e-6, rtol=1e-6)


def test_ties_rank_the_lower_row_first():
    corpus = np.ones((20, DIM), np.float32)  # every row ties
    s, i = search.search(np.ones((2, DIM)), corpus, 20, chunk_rows=8, row_block=1)
    np.testing.assert_array_equal(i, np.tile(np.arange(20), (2, 1)))
    np.testing.assert_allclose(s, 1.0, atol=1e-6)


@pytest.mark.slow
def test_two_processes_search_equals_one_process(two_processes):
    """Each process ranks its chunks (c % 2) on its 4 devices; both return the result of
    one process (bit for bit on a 4-device mesh), ties across processes included."""
    corpus, queries = search_vectors()
    run = two_processes.root / "search"
    reports = [two_processes.report("search", pid) for pid in range(2)]
    assert [r["rc"] for r in reports] == [0, 0], [two_processes.log("search", p) for p in (0, 1)]
    nan = f"the corpus: row {SEARCH_NAN_ROW} holds NaN or infinite values"
    assert [r["nan_error"] for r in reports] == [f"search: process 1 failed: {nan}", nan]
    got = [np.load(run / f"result_{pid}.npz") for pid in range(2)]
    mesh = search.corpus_mesh(jax.local_devices()[:4])
    folder = search.Corpus(run / "corpus")
    for n, (k, score, chunk, block) in enumerate(SEARCH_CASES):
        s, i = got[0][f"scores_{n}"], got[0][f"rows_{n}"]
        np.testing.assert_array_equal(got[1][f"scores_{n}"], s)
        np.testing.assert_array_equal(got[1][f"rows_{n}"], i)
        assert s.dtype == np.float32 and i.dtype == np.int64 and i.shape == (9, k)
        want_s, want_i = brute_force(queries, corpus, k, score)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_allclose(s, want_s, atol=1e-6, rtol=1e-6)
        one_s, one_i = search.search(queries, folder, k, score=score, mesh=mesh,
                                     chunk_rows=chunk, row_block=block, query_batch=4)
        np.testing.assert_array_equal(i, one_i)
        np.testing.assert_array_equal(s, one_s)
        # Each process read its own chunks only.
        starts = [got[p][f"read_{n}"][:, 0].tolist() for p in range(2)]
        assert starts == ([[0, 16, 32], [8, 24]] if chunk == 8 else [[0], []])
    np.testing.assert_array_equal(i[-1], np.arange(k))  # a zero query: every score ties
    lines = [json.loads(x) for x in (run / "run.jsonl").read_text().splitlines()]
    _, want_i = brute_force(queries, corpus, 10, "cos")
    assert [x["query_id"] for x in lines] == [f"q{q}" for q in range(9)]
    assert [[h["corpus_id"] for h in x["hits"]] for x in lines] == \
        [[f"d{j}" for j in row] for row in want_i]
    assert not list(run.glob(".run.jsonl*"))


def test_corpus_reads_parts_in_chunks_across_their_bounds(tmp_path):
    rows = vectors(23, 2)
    corpus = search.Corpus(write_export(tmp_path / "c", rows, parts=4))
    assert corpus.num_rows == 23 and corpus.dim == DIM
    assert corpus.all_ids() == [f"d{i}" for i in range(23)]
    assert corpus.ids_of(np.array([[22, 4], [4, 9]])) == {4: "d4", 9: "d9", 22: "d22"}
    got = list(corpus.chunks(5))
    assert [a for a, _ in got] == [0, 5, 10, 15, 20]
    np.testing.assert_array_equal(np.concatenate([c for _, c in got]), rows)
    # Every second chunk from the second (process 1 of 2): across a part's bound too.
    got = list(corpus.chunks(5, 1, 2))
    assert [a for a, _ in got] == [5, 15]
    np.testing.assert_array_equal(np.concatenate([c for _, c in got]), rows[[*range(5, 10),
                                                                             *range(15, 20)]])
    assert all(isinstance(a, np.memmap) for a in corpus.arrays)
    arrays, ids, _ = export.load_arrays(tmp_path / "c")  # the parts concatenated
    np.testing.assert_array_equal(arrays["embeddings"], rows)
    assert ids == corpus.all_ids()


def test_search_refuses_k_dims_and_nan(tmp_path):
    corpus = search.Corpus(write_export(tmp_path / "c", vectors(10, 0)))
    with pytest.raises(ValueError, match=r"k=11 must lie in \[1, 10\]"):
        search.search(np.ones((1, DIM)), corpus, 11)
    with pytest.raises(ValueError, match="dimension 8, but the queries have 3"):
        search.search(np.ones((1, 3)), corpus, 1)
    bad = vectors(10, 0)
    bad[6, 2] = np.nan
    with pytest.raises(ValueError, match="row 6 holds NaN"):
        search.search(np.ones((1, DIM)), bad, 1, chunk_rows=4)


# ---- the command line ----


@pytest.fixture()
def files(tmp_path):
    corpus = vectors(30, 0)
    queries = vectors(6, 1)
    return {
        "corpus": str(write_export(tmp_path / "corpus", corpus, parts=2)),
        "queries": str(write_export(tmp_path / "queries", queries,
                                    [f"q{i}" for i in range(6)])),
        "corpus_rows": corpus, "query_rows": queries, "tmp": tmp_path}


def _run(*argv: str) -> int:
    return cli_main.main(["search", *argv])


def test_cli_jsonl_and_trec_runs(files, capsys):
    out = files["tmp"] / "run.jsonl"
    assert _run(f"--corpus={files['corpus']}", f"--queries={files['queries']}",
                f"--output={out}", "--top_k=4", "--chunk_rows=8") == 0
    want_s, want_i = brute_force(files["query_rows"], files["corpus_rows"], 4, "cos")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["query_id"] for x in lines] == [f"q{i}" for i in range(6)]
    for line, s, i in zip(lines, want_s, want_i, strict=True):
        assert [h["corpus_id"] for h in line["hits"]] == [f"d{j}" for j in i]
        np.testing.assert_allclose([h["score"] for h in line["hits"]], s, atol=1e-6)
    trec = files["tmp"] / "run.trec"
    assert _run(f"--corpus={files['corpus']}", f"--queries={files['queries']}",
                f"--output={trec}", "--top_k=4", "--score=dot", "--run_name=mine") == 0
    rows = [r.split() for r in trec.read_text().splitlines()]
    want_s, want_i = brute_force(files["query_rows"], files["corpus_rows"], 4, "dot")
    assert len(rows) == 24 and rows[0][:4] == ["q0", "Q0", f"d{want_i[0, 0]}", "1"]
    assert rows[5][3] == "2" and all(r[5] == "mine" for r in rows)
    np.testing.assert_allclose([float(r[4]) for r in rows], want_s.ravel(), atol=1e-6)


def test_cli_qrels_equal_the_retrieval_evaluator(files, capsys):
    from embedding_core.evaluation.retrieval import InformationRetrievalEvaluator

    qrels = files["tmp"] / "qrels.tsv"
    pairs = {"q0": {"d3": 1, "d9": 2}, "q1": {"d12": 1}, "q2": {"d29": 1}, "q4": {"d0": 3}}
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{g}\n" for q, ds in pairs.items() for d, g in ds.items()) + "q5\td1\t0\n")
    out = files["tmp"] / "run.jsonl"
    capsys.readouterr()
    assert _run(f"--corpus={files['corpus']}", f"--queries={files['queries']}",
                f"--output={out}", f"--qrels={qrels}") == 0
    printed = dict(line.split(": ") for line in capsys.readouterr().out.splitlines())
    _, rows = brute_force(files["query_rows"], files["corpus_rows"], 10, "cos")
    evaluator = InformationRetrievalEvaluator(
        {f"q{i}": "" for i in range(6)}, {f"d{i}": "" for i in range(30)}, pairs,
        map_at_k=(10,))
    want = evaluator.compute_metrics(rows[[0, 1, 2, 4]])
    assert set(printed) == set(want)
    for name, value in want.items():
        assert float(printed[name]) == pytest.approx(value, abs=1e-4), name


def _error(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert _run(*argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_cli_bad_inputs_give_one_line_and_no_output(files, tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    other = write_export(tmp_path / "wide", np.ones((4, DIM + 1), np.float32))
    line = _error(capsys, f"--corpus={files['corpus']}", f"--queries={other}", f"--output={out}",
                  "--top_k=2")
    assert files["corpus"] in line and "dimension 8" in line and "have 9" in line
    assert _error(capsys, f"--corpus={files['corpus']}", f"--queries={files['queries']}",
                  f"--output={out}", "--top_k=31").endswith(
        "--top_k=31 is larger than the corpus (30 rows); give --top_k <= 30")
    broken = tmp_path / "broken"
    write_export(broken, vectors(12, 3), parts=3)
    part = sorted(p for p in broken.iterdir() if p.is_dir())[1]
    (part / "meta.json").unlink()
    assert str(part / "meta.json") in _error(capsys, f"--corpus={broken}",
                                             f"--queries={files['queries']}", f"--output={out}")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert str(empty) in _error(capsys, f"--corpus={files['corpus']}", f"--queries={empty}",
                                "--model=unused", f"--output={out}")
    zeros = tmp_path / "qrels.tsv"
    zeros.write_text("query-id\tcorpus-id\tscore\nq0\td1\t0\n")
    assert str(zeros) in _error(capsys, f"--corpus={files['corpus']}",
                                f"--queries={files['queries']}", f"--qrels={zeros}",
                                f"--output={out}")
    assert not out.exists() and not list(tmp_path.glob(".run.jsonl*"))


def test_cli_encodes_a_query_file_with_the_model(tiny_bert_dir, files, tmp_path):
    from embedding_core.serving.st_models import load_encoder

    encoder = load_encoder(str(tiny_bert_dir))
    texts = ["a cat sat on the mat", "stock markets fell", "the cat is black"]
    corpus = np.asarray(encoder.encode_document(texts + ["rain today", "dogs bark"]),
                        np.float32)
    folder = write_export(tmp_path / "docs", corpus)
    query_file = tmp_path / "q.txt"
    query_file.write_text("\n".join(texts) + "\n")
    out = tmp_path / "run.jsonl"
    assert _run(f"--corpus={folder}", f"--queries={query_file}", f"--model={tiny_bert_dir}",
                f"--output={out}", "--top_k=2") == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["query_id"] for x in lines] == ["1", "2", "3"]
    assert [x["hits"][0]["corpus_id"] for x in lines] == ["d0", "d1", "d2"]
    beir = tmp_path / "queries.jsonl"  # BEIR queries: their _id
    beir.write_text("".join(json.dumps({"_id": f"b{i}", "text": t}) + "\n"
                            for i, t in enumerate(texts)))
    assert _run(f"--corpus={folder}", f"--queries={beir}", f"--model={tiny_bert_dir}",
                f"--output={out}", "--top_k=2") == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["query_id"], x["hits"][0]["corpus_id"]) for x in lines] == [
        ("b0", "d0"), ("b1", "d1"), ("b2", "d2")]


def test_usage_names_the_commands(capsys):
    assert cli_main.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "search" in text and "mine-hard-negatives" in text
    assert search_cli.parser().parse_args(
        ["--corpus=c", "--queries=q", "--output=o"]).top_k == 10


def test_cli_on_gs_equals_the_local_run(gcs_emulator, files, tmp_path, monkeypatch):
    from embedding_core.storage import storage

    monkeypatch.setenv(storage.CACHE_ENV, str(tmp_path / "cache"))
    remote = "gs://test-bucket/search40"
    for name in ("corpus", "queries"):
        for file in Path(files[name]).rglob("*"):
            if file.is_file():
                rel = file.relative_to(files[name]).as_posix()
                storage.upload(file, f"{remote}/{name}/{rel}")
    local = tmp_path / "run.jsonl"
    assert _run(f"--corpus={files['corpus']}", f"--queries={files['queries']}",
                f"--output={local}", "--top_k=3") == 0
    assert _run(f"--corpus={remote}/corpus", f"--queries={remote}/queries",
                f"--output={remote}/run.jsonl", "--top_k=3") == 0
    assert storage.as_path(f"{remote}/run.jsonl").read_text() == local.read_text()
