"""embedding-jax index (embedding_core/serving/index.py): each kind, loaded back by faiss or
usearch alone, finds what the printed recall@10 says (recomputed here independently);
bad input is one line, exit 1, and no index file, whole or partial, is left."""

from __future__ import annotations

import re

import numpy as np
import pytest

from embedding_core.main import main
from embedding_core.serving import export

faiss = pytest.importorskip("faiss", reason="faiss-cpu not installed (extra `index`)")

N, DIM, QUERIES, SEED = 600, 24, 50, 3


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A float export of clustered rows (cosine) and its binary/ubinary exports."""
    root = tmp_path_factory.mktemp("exports")
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, DIM))
    rows = (centers[rng.integers(0, 12, N)] + 0.4 * rng.normal(size=(N, DIM))).astype(np.float32)
    meta = {"model": "m", "config": {}, "step": None, "normalized": False,
            "similarity": "cosine"}
    export.export_view(root / "float", [([f"r{i}" for i in range(N)], rows)], num_rows=N,
                       dim=DIM, meta=meta, split=False)
    for precision in ("binary", "ubinary"):
        assert main(["quantize", f"--input={root / 'float'}", f"--output={root / precision}",
                     f"--precision={precision}"]) == 0
    return root, rows


def _sample():
    """The query rows as the command documents them."""
    rng = np.random.default_rng(SEED)
    return np.sort(rng.choice(N, size=QUERIES, replace=False))


def _exact(rows):
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    scores = unit[_sample()] @ unit.T
    return unit, np.argsort(-scores, axis=1, kind="stable")[:, :10]


def _recall(found, exact):
    return np.mean([len(set(f.tolist()) & set(e.tolist())) / 10
                    for f, e in zip(found, exact, strict=True)])


def _run(capsys, *flags):
    assert main(["index", f"--queries={QUERIES}", f"--seed={SEED}", *map(str, flags)]) == 0
    out = capsys.readouterr().out
    return [float(v) for v in re.findall(r"recall@10 ([0-9.]+)", out)], out


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_faiss_float_kinds(kind, exports, capsys, tmp_path):
    root, rows = exports
    (printed,), out = _run(capsys, f"--input={root / 'float'}", f"--output={tmp_path / 'i'}",
                           f"--kind={kind}", "--nlist=10", "--nprobe=2", "--M=8")
    index = faiss.read_index(str(tmp_path / "i"))
    assert index.ntotal == N and index.metric_type == faiss.METRIC_INNER_PRODUCT
    unit, exact = _exact(rows)
    found = index.search(unit[_sample()].astype(np.float32), 10)[1]
    assert printed == round(_recall(found, exact), 4), out
    if kind == "flat":
        assert printed == 1.0
    if kind == "ivf":
        assert faiss.extract_index_ivf(index).nlist == 10 and printed < 1.0


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
def test_binary_flat_and_its_rescored_recall(precision, exports, capsys, tmp_path):
    root, rows = exports
    (hamming, rescored), out = _run(capsys, f"--input={root / precision}",
                                    f"--output={tmp_path / 'b'}", "--kind=binary-flat",
                                    f"--float={root / 'float'}", "--rescore_multiplier=3")
    index = faiss.read_index_binary(str(tmp_path / "b"))
    assert index.ntotal == N and index.d == DIM
    unit, exact = _exact(rows)
    bits = np.packbits(rows > 0, axis=1)
    queries = bits[_sample()]
    assert hamming == round(_recall(index.search(queries, 10)[1], exact), 4), out
    cand = index.search(queries, 30)[1]
    scores = np.einsum("qd,qkd->qk", unit[_sample()], np.unpackbits(bits[cand], axis=-1))
    best = np.take_along_axis(cand, np.lexsort((cand, -scores), axis=1)[:, :10], 1)
    assert rescored == round(_recall(best, exact), 4) and rescored > hamming, out


@pytest.mark.parametrize("source", ["float", "ubinary"])
def test_usearch(source, exports, capsys, tmp_path):
    usearch = pytest.importorskip("usearch.index", reason="usearch not installed (extra `index`)")
    root, rows = exports
    printed, out = _run(capsys, f"--input={root / source}", f"--output={tmp_path / 'u'}",
                        "--kind=usearch", f"--float={root / 'float'}")
    index = usearch.Index.restore(str(tmp_path / "u"))
    assert len(index) == N
    unit, exact = _exact(rows)
    queries = unit[_sample()].astype(np.float32) if source == "float" else \
        np.packbits(rows > 0, axis=1)[_sample()]
    found = index.search(queries, 10).keys
    assert printed[0] == round(_recall(found, exact), 4), out
    assert (printed[0] > 0.9) if source == "float" else (len(printed) == 2)


def test_bad_input(exports, capsys, tmp_path, monkeypatch):
    root, _ = exports
    out = tmp_path / "x.index"
    cases = [
        (["--kind=binary-flat", f"--input={root / 'ubinary'}", f"--float={tmp_path / 'gone'}"],
         [tmp_path / "gone", "does not exist"]),
        (["--kind=binary-flat", f"--input={root / 'ubinary'}"], ["--float=EXPORT"]),
        (["--kind=binary-flat", f"--input={root / 'float'}"], ["binary/ubinary export"]),
        (["--kind=flat", f"--input={root / 'ubinary'}"], ["ubinary export"]),
        (["--kind=annoy", f"--input={root / 'float'}"], ["'annoy'"]),
        (["--kind=flat", f"--input={tmp_path / 'none'}"], [tmp_path / "none"]),
        (["--kind=binary-flat", f"--input={root / 'ubinary'}", f"--float={root / 'binary'}"],
         [root / "binary", "not float"]),
    ]
    for flags, names in cases:
        assert main(["index", f"--output={out}", *map(str, flags)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and all(str(n) in err for n in names), err
        assert not out.exists()
    # A write that fails half-way: neither the index nor its temporary file is left, and an
    # index already there stays as it was.
    real = faiss.write_index

    def half(index, path):
        with open(path, "wb") as f:
            f.write(b"half an index")
        raise OSError(f"{path}: No space left on device")

    monkeypatch.setattr(faiss, "write_index", half)
    for before in (None, b"the old index"):
        if before:
            out.write_bytes(before)
        assert main(["index", f"--output={out}", "--kind=flat",
                     f"--input={root / 'float'}"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "No space left" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == (["x.index"] if before else [])
        assert not before or out.read_bytes() == before
    monkeypatch.setattr(faiss, "write_index", real)
