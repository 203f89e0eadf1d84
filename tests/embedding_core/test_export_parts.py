"""Exports from several processes: one part folder per process, one manifest; equal to the
one-process export (2 processes x 4 CPU devices against 1 x 8, ``export_worker.py``)."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from embedding_core.serving.export_reader import load_export, load_view
from tests import two_processes

HERE = Path(__file__).parent
ROWS = two_processes.EXPORT_ROWS  # odd: the parts hold 6 and 5 rows


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """``(root, worker, report)``: ``root/single`` exported by this process alone (8
    devices) from the two-process run's inputs (``tests/two_processes.py``)."""
    root = two_processes.export_inputs(tmp_path_factory.mktemp("export_parts"))
    worker = two_processes.load(HERE / "export_worker.py")
    return root, worker, worker.run(two_processes.export_spec(root, "single", 1, 0, 0))


@pytest.fixture(scope="module")
def exports(single, two_processes):
    """``(root, worker, reports, single, outs)``: ``root/multi`` from the shared two-process
    run, ``single``'s export from this process."""
    root, worker, report = single
    multi = two_processes.root / "export_parts"
    reports = [two_processes.report("export_parts", pid) for pid in range(2)]
    outs = [two_processes.log("export_parts", pid) for pid in range(2)]
    return multi, worker, reports, report, outs, root


def test_one_process_export_is_one_file_per_view_and_a_bad_row_is_named(single):
    """The in-process side of the two-process tests below: the one-process layout, the
    synthetic rows, and the NaN row named with nothing left of the failed view."""
    root, worker, report = single
    views = load_export(root / "single" / "ok")
    assert sorted(views) == ["table", "texts"]
    for view, (_, _, meta) in views.items():
        assert "parts" not in meta, view
        assert sorted(p.name for p in (root / "single" / "ok" / view).iterdir()) == [
            "embeddings.npy", "ids.txt", "meta.json"]
    assert views["table"][1] == [f"row{i}" for i in range(ROWS)]
    np.testing.assert_array_equal(views["table"][0], worker.table_rows(np.arange(ROWS), 8))
    assert views["texts"][1] == [f"text number {i}" for i in range(9)]
    assert report["error"].startswith("ValueError: ") and "row 7" in report["error"]
    assert "not finite" in report["error"]
    assert sorted(p.name for p in (root / "single" / "bad").iterdir()) == [
        "export.json", "table"]
    with pytest.raises(ValueError, match="did not finish"):
        load_export(root / "single" / "bad")


@pytest.mark.slow
def test_parts_equal_the_one_process_export(exports):
    root, worker, _, _, outs, local = exports
    multi, single = load_export(root / "multi" / "ok"), load_export(local / "single" / "ok")
    assert sorted(multi) == sorted(single) == ["table", "texts"]
    for view in multi:
        (a, ids_a, meta_a), (b, ids_b, meta_b) = multi[view], single[view]
        assert ids_a == ids_b and np.array_equal(a, b), view
        n = len(ids_b)
        assert [p["num_rows"] for p in meta_a["parts"]] == [(n + 1) // 2, n // 2]
        assert "parts" not in meta_b  # one process: the single-file layout
        # Only the second export's parts are left; each part is a view folder of its own.
        folder = root / "multi" / "ok" / view
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["meta.json", *(p["folder"] for p in meta_a["parts"])])
        first = load_view(folder / meta_a["parts"][0]["folder"])
        assert first[1] == ids_b[:(n + 1) // 2]
    assert multi["table"][1] == [f"row{i}" for i in range(ROWS)]
    np.testing.assert_array_equal(multi["table"][0], worker.table_rows(np.arange(ROWS), 8))
    assert multi["texts"][1] == [f"text number {i}" for i in range(9)]
    # The export's summary is printed by process 0 alone.
    assert [("wrote " in out) for out in outs] == [True, False]


@pytest.mark.slow
def test_a_bad_row_in_one_part_stops_both_and_leaves_no_view(exports):
    root, _, reports, single, _, _ = exports
    assert "row 7" in single["error"] and "not finite" in single["error"]
    assert reports[1]["error"] == "ValueError: " + single["error"].split(": ", 1)[1]
    assert reports[0]["error"].startswith("ValueError: ") and "process 1 failed" in \
        reports[0]["error"]
    bad = root / "multi" / "bad"
    # The table view was complete; the texts view left nothing, not even a part folder.
    assert sorted(p.name for p in bad.iterdir()) == ["export.json", "table"]
    with pytest.raises(ValueError, match="did not finish"):
        load_export(bad)


@pytest.mark.slow
def test_one_process_over_parts_replaces_them(exports, tmp_path):
    root, worker, _, _, _, _ = exports
    from embedding_core.serving import serving

    target = tmp_path / "ok"  # a copy: the shared run's folder is read by other tests
    shutil.copytree(root / "multi" / "ok", target)
    serving.export(lambda: worker.Synthetic(ROWS), target, input_path=root / "in.txt")
    assert sorted(p.name for p in (target / "table").iterdir()) == [
        "embeddings.npy", "ids.txt", "meta.json"]
    assert load_export(target)["table"][1] == [f"row{i}" for i in range(ROWS)]
