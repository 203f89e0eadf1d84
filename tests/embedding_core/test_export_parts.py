"""Exports from several processes: one part folder per process, one manifest; equal to the
one-process export (2 processes x 4 CPU devices against 1 x 8, ``export_worker.py``)."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedding_core.serving.export_reader import load_export, load_view

HERE = Path(__file__).parent
ROWS = 11  # odd: the parts hold 6 and 5 rows


def _worker():
    spec = importlib.util.spec_from_file_location("export_worker", HERE / "export_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``(root, worker, reports)``: ``root/multi`` from 2 processes, ``root/single`` from this
    one, for the same inputs (9 texts; ``bad.txt``'s 8th is ``NaN``: process 1's rows)."""
    root = tmp_path_factory.mktemp("export_parts")
    texts = [f"text number {i}" for i in range(9)]
    (root / "in.txt").write_text("".join(f"{t}\n" for t in texts))
    (root / "bad.txt").write_text("".join(f"{t}\n" for t in texts[:7] + ["NaN", "x"]))
    port = _free_port()

    def spec(name, n, pid):
        return {"coordinator": f"localhost:{port}", "num_processes": n, "process_id": pid,
                "rows": ROWS, "input": str(root / "in.txt"), "bad_input": str(root / "bad.txt"),
                "out": str(root / name), "report": str(root / f"{name}_{pid}.json")}

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    procs = []
    for pid in range(2):
        path = root / f"spec_{pid}.json"
        path.write_text(json.dumps(spec("multi", 2, pid)))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "export_worker.py"), str(path)],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    worker = _worker()
    single = worker.run(spec("single", 1, 0))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    reports = [json.loads((root / f"multi_{pid}.json").read_text()) for pid in range(2)]
    return root, worker, reports, single, outs


def test_parts_equal_the_one_process_export(exports):
    root, worker, _, _, outs = exports
    multi, single = load_export(root / "multi" / "ok"), load_export(root / "single" / "ok")
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


def test_a_bad_row_in_one_part_stops_both_and_leaves_no_view(exports):
    root, _, reports, single, _ = exports
    assert "row 7" in single["error"] and "not finite" in single["error"]
    assert reports[1]["error"] == "ValueError: " + single["error"].split(": ", 1)[1]
    assert reports[0]["error"].startswith("ValueError: ") and "process 1 failed" in \
        reports[0]["error"]
    bad = root / "multi" / "bad"
    # The table view was complete; the texts view left nothing, not even a part folder.
    assert sorted(p.name for p in bad.iterdir()) == ["export.json", "table"]
    with pytest.raises(ValueError, match="did not finish"):
        load_export(bad)


def test_one_process_over_parts_replaces_them(exports):
    root, worker, _, _, _ = exports
    from embedding_core.serving import serving

    target = root / "multi" / "ok"
    serving.export(lambda: worker.Synthetic(ROWS), target, input_path=root / "in.txt")
    assert sorted(p.name for p in (target / "table").iterdir()) == [
        "embeddings.npy", "ids.txt", "meta.json"]
    assert load_export(target)["table"][1] == [f"row{i}" for i in range(ROWS)]
