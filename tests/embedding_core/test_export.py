"""Streaming, atomic embedding export: round trip, failure cleanup, validation, memory."""

import json
import os
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest

from embedding_core.serving.export import EmbeddingWriter, export_embeddings
from embedding_core.serving.export_reader import load_arrays

IDS = ["a", "b b", "ünï", "d\tx", "e", "f", "g", "h", "i", "j"]


def _arrays(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return {"r": rng.normal(size=(n, 4)), "u": rng.normal(size=(n, 3)).astype(np.float32)}


def _snapshot(directory):
    """{file name: bytes} of everything in a directory (hidden temp files included)."""
    return {p: (directory / p).read_bytes() for p in sorted(os.listdir(directory))}


def _write_export(out_dir, arrays, ids, meta=None):
    with EmbeddingWriter(out_dir, {"r": 4, "u": 3}, len(ids), meta=meta) as w:
        w.write(0, {k: v for k, v in arrays.items()}, ids)


def test_round_trip_blocks_in_any_order(tmp_path):
    src = _arrays()
    out = tmp_path / "export"
    with EmbeddingWriter(out, {"r": 4, "u": 3}, 10, meta={"model": "tiny", "step": 7}) as w:
        for lo, hi in [(6, 10), (0, 3), (3, 6)]:
            w.write(lo, {"r": src["r"][lo:hi], "u": src["u"][lo:hi]}, IDS[lo:hi])
    assert sorted(os.listdir(out)) == ["ids.txt", "meta.json", "r.npy", "u.npy"]

    arrays, ids, meta = load_arrays(out)
    assert ids == IDS
    # Row i of every array belongs to line i of ids.txt.
    lines = (out / "ids.txt").read_text(encoding="utf-8").split("\n")
    assert lines[:-1] == IDS and lines[-1] == ""
    for name in ("r", "u"):
        assert arrays[name].dtype == np.float32
        np.testing.assert_array_equal(arrays[name], src[name].astype(np.float32))
    np.testing.assert_array_equal(np.load(out / "r.npy")[2], src["r"][2].astype(np.float32))
    assert meta["model"] == "tiny" and meta["step"] == 7
    assert meta["num_rows"] == 10
    assert meta["arrays"]["r"] == {"file": "r.npy", "shape": [10, 4], "dtype": "float32"}
    assert meta["ids_file"] == "ids.txt" and meta["created_utc"].endswith("+00:00")


def test_export_embeddings_wrapper_accepts_jax_arrays(tmp_path):
    src = _arrays()
    batches = [
        (IDS[:4], {"r": jnp.asarray(src["r"][:4]), "u": jnp.asarray(src["u"][:4])}),
        (IDS[4:], {"r": src["r"][4:], "u": src["u"][4:]}),
    ]
    paths = export_embeddings(
        tmp_path, batches, num_rows=10, dims={"r": 4, "u": 3}, meta={}, ids_filename="keys.txt"
    )
    assert paths == {
        "r": tmp_path / "r.npy",
        "u": tmp_path / "u.npy",
        "ids": tmp_path / "keys.txt",
        "meta": tmp_path / "meta.json",
    }
    arrays, ids, _ = load_arrays(tmp_path)
    assert ids == IDS
    np.testing.assert_allclose(arrays["r"], src["r"], rtol=1e-6)


def test_exception_midway_leaves_older_export_untouched(tmp_path):
    _write_export(tmp_path, _arrays(seed=1), IDS, meta={"version": "old"})
    before = _snapshot(tmp_path)
    src = _arrays(seed=2)
    with pytest.raises(RuntimeError, match="encoder crashed"):
        with EmbeddingWriter(tmp_path, {"r": 4, "u": 3}, 10) as w:
            w.write(0, {"r": src["r"][:5], "u": src["u"][:5]}, IDS[:5])
            raise RuntimeError("encoder crashed")
    assert _snapshot(tmp_path) == before
    assert load_arrays(tmp_path)[2]["version"] == "old"


def test_failure_removes_a_directory_it_created(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with EmbeddingWriter(out, {"r": 4}, 10):
            raise RuntimeError("stop")
    assert not out.exists()


def test_missing_rows_raise_and_export_nothing(tmp_path):
    _write_export(tmp_path, _arrays(seed=1), IDS)
    before = _snapshot(tmp_path)
    src = _arrays()
    with pytest.raises(ValueError, match=r"2 of 10 rows were never written .*\[4, 5\]"):
        with EmbeddingWriter(tmp_path, {"r": 4, "u": 3}, 10) as w:
            w.write(0, {"r": src["r"][:4], "u": src["u"][:4]}, IDS[:4])
            w.write(6, {"r": src["r"][6:], "u": src["u"][6:]}, IDS[6:])
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "bad_value, match",
    [(np.nan, "row 7 .* not finite"), (1e300, "row 7 .* not finite")],  # 1e300 -> inf in f32
    ids=["nan", "overflow"],
)
def test_non_finite_block_is_rejected(tmp_path, bad_value, match):
    _write_export(tmp_path, _arrays(seed=1), IDS)
    before = _snapshot(tmp_path)
    src = _arrays()
    src["r"][7, 2] = bad_value
    with pytest.raises(ValueError, match=match):
        with EmbeddingWriter(tmp_path, {"r": 4, "u": 3}, 10) as w:
            w.write(5, {"r": src["r"][5:], "u": src["u"][5:]}, IDS[5:])
    assert _snapshot(tmp_path) == before


def test_write_validation(tmp_path):
    src = _arrays()
    with (
        pytest.raises(ValueError, match="8 of 10 rows were never written"),
        EmbeddingWriter(tmp_path, {"r": 4, "u": 3}, 10) as w,
    ):
        w.write(0, {"r": src["r"][:2], "u": src["u"][:2]}, IDS[:2])
        with pytest.raises(ValueError, match="row 1 was already written"):
            w.write(1, {"r": src["r"][1:3], "u": src["u"][1:3]}, IDS[1:3])
        with pytest.raises(ValueError, match="line break"):
            w.write(2, {"r": src["r"][2:3], "u": src["u"][2:3]}, ["x\ny"])
        with pytest.raises(ValueError, match="block shape"):
            w.write(2, {"r": src["r"][2:4, :3], "u": src["u"][2:4]}, IDS[2:4])
        with pytest.raises(ValueError, match="exactly the arrays"):
            w.write(2, {"r": src["r"][2:4]}, IDS[2:4])
        with pytest.raises(ValueError, match="outside"):
            w.write(9, {"r": src["r"][:2], "u": src["u"][:2]}, IDS[:2])
        # Rejected blocks wrote nothing, so rows 2..9 are still missing at exit.
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="reserved"):
        EmbeddingWriter(tmp_path, {"ids": 4}, 10)
    with pytest.raises(ValueError, match="reserved"):
        EmbeddingWriter(tmp_path, {"r": 4}, 10, meta={"num_rows": 3})
    with pytest.raises(RuntimeError, match="with"):
        EmbeddingWriter(tmp_path, {"r": 4}, 1).write(0, {"r": np.zeros((1, 4))}, ["a"])


def test_load_arrays_detects_a_truncated_id_file(tmp_path):
    _write_export(tmp_path, _arrays(), IDS)
    (tmp_path / "ids.txt").write_text("\n".join(IDS[:9]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ids.txt: 9 ids, .*'num_rows' is 10"):
        load_arrays(tmp_path)


def test_streaming_export_memory_stays_far_below_array_size(tmp_path):
    num_rows, dim, block = 200_000, 64, 5_000
    full_bytes = num_rows * dim * 4  # 51.2 MB as float32

    def block_data(b):
        return np.random.default_rng(b).standard_normal((block, dim), dtype=np.float32)

    tracemalloc.start()
    try:
        with EmbeddingWriter(tmp_path, {"e": dim}, num_rows) as w:
            for b in range(num_rows // block):
                ids = [f"doc{i}" for i in range(b * block, (b + 1) * block)]
                w.write(b * block, {"e": block_data(b)}, ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < full_bytes / 10, f"peak {peak / 1e6:.1f} MB"

    arrays, ids, meta = load_arrays(tmp_path, mmap_mode="r")
    assert arrays["e"].shape == (num_rows, dim) and len(ids) == num_rows
    assert ids[123_456] == "doc123456"
    last = num_rows // block - 1
    np.testing.assert_array_equal(arrays["e"][last * block :], block_data(last))
    np.testing.assert_array_equal(arrays["e"][:block], block_data(0))
    assert json.loads((tmp_path / "meta.json").read_text())["arrays"]["e"]["shape"] == [
        num_rows,
        dim,
    ]


def test_views_are_readable_by_others_and_load_back(tmp_path):
    from embedding_core.serving.export import export_view
    from embedding_core.serving.export_reader import load_export, load_view

    old = os.umask(0o022)
    try:
        vecs = np.arange(12, dtype=np.float32).reshape(3, 4)
        meta = {"model": "m", "config": {}, "step": 2, "normalized": False,
                "similarity": "cosine"}
        for view in ("explicit", "implicit"):
            export_view(tmp_path / "out" / view, [(["a", "b", "c"], vecs)], num_rows=3, dim=4,
                        meta=meta)
    finally:
        os.umask(old)
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o644, path
    views = load_export(tmp_path / "out")
    assert sorted(views) == ["explicit", "implicit"]
    emb, ids, got = views["implicit"]
    np.testing.assert_array_equal(emb, vecs)
    assert ids == ["a", "b", "c"] and got["step"] == 2 and got["similarity"] == "cosine"
    assert list(load_export(tmp_path / "out" / "explicit")) == ["explicit"]
    np.testing.assert_array_equal(load_view(tmp_path / "out" / "explicit")[0], vecs)
    with pytest.raises(ValueError, match="lacks"):
        export_view(tmp_path / "bad", [(["a"], vecs[:1])], num_rows=1, dim=4, meta={})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(FileNotFoundError, match="no export"):
        load_export(tmp_path)


def _view_meta(step):
    return {"model": "m", "config": {}, "step": step, "normalized": False,
            "similarity": "cosine"}


def test_an_interrupted_export_is_refused_and_stale_views_are_ignored(tmp_path):
    from embedding_core.serving.export import ExportFolder
    from embedding_core.serving.export_reader import load_export

    vecs = np.ones((2, 3), np.float32)
    with ExportFolder(tmp_path) as folder:
        for view in ("a", "b", "c"):
            folder.view(view, [(["x", "y"], vecs * 1)], num_rows=2, dim=3, meta=_view_meta(1))
    # A second export of two views into the same folder: "c" is stale and not read.
    with ExportFolder(tmp_path) as folder:
        for view in ("a", "b"):
            folder.view(view, [(["x", "y"], vecs * 2)], num_rows=2, dim=3, meta=_view_meta(2))
    views = load_export(tmp_path)
    assert sorted(views) == ["a", "b"] and all(v[2]["step"] == 2 for v in views.values())
    # A third export dies after its first view: the folder now mixes two exports.
    with pytest.raises(RuntimeError), ExportFolder(tmp_path) as folder:
        folder.view("a", [(["x", "y"], vecs * 3)], num_rows=2, dim=3, meta=_view_meta(3))
        raise RuntimeError("killed")
    with pytest.raises(ValueError, match="interrupted"):
        load_export(tmp_path)
    with pytest.raises(FileExistsError, match="not a folder"):
        ExportFolder(tmp_path / "a" / "ids.txt")


def test_a_first_export_killed_half_way_is_refused_and_a_failure_before_any_view_is_harmless(
        tmp_path):
    from embedding_core.serving.export import ExportFolder
    from embedding_core.serving.export_reader import load_export

    vecs = np.ones((2, 3), np.float32)
    with pytest.raises(RuntimeError), ExportFolder(tmp_path / "new") as folder:
        folder.view("a", [(["x", "y"], vecs)], num_rows=2, dim=3, meta=_view_meta(1))
        raise RuntimeError("killed")
    with pytest.raises(ValueError, match="did not finish"):
        load_export(tmp_path / "new")
    with ExportFolder(tmp_path / "old") as folder:
        folder.view("a", [(["x", "y"], vecs)], num_rows=2, dim=3, meta=_view_meta(1))
    with pytest.raises(ValueError, match="not finite"), ExportFolder(tmp_path / "old") as folder:
        folder.view("a", [(["x", "y"], vecs * np.nan)], num_rows=2, dim=3, meta=_view_meta(2))
    assert load_export(tmp_path / "old")["a"][2]["step"] == 1  # the old export still reads


def test_a_file_in_the_way_of_an_export_is_one_line(tmp_path):
    from embedding_core.serving.export import ExportFolder

    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=r"^--output .*afile/sub: .*afile exists and is "
                       "not a folder$"):
        ExportFolder(tmp_path / "afile" / "sub")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "explicit").write_text("x")
    with pytest.raises(FileExistsError, match=r"out/explicit is a file, where the view "
                       "'explicit' goes$"):
        ExportFolder(tmp_path / "out").tag("explicit")
