"""Several processes split evaluation and export: each encodes its slice, one writes.

The 2-process test runs DualCSE's RTE/EIS evaluation and export and DocEnt's ranking
evaluation (with baselines) and export on 2 processes x 4 CPU devices (jax.distributed,
gloo) and on 1 process x 8 devices, from the same trained workdirs, and compares: rows
encoded per process (their sum is the single process's count, so no row is encoded
twice), the evaluation files, the export folders, and which process wrote files.
"""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.distributed import multihost
from tests import two_processes

HERE = Path(__file__).parent


def test_process_rows_cut_in_process_order():
    # 10 rows on 3 processes: the first 10 % 3 = 1 process gets one more.
    assert [multihost.process_rows(10, i, 3) for i in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [multihost.process_rows(2, i, 3) for i in range(3)] == [(0, 1), (1, 2), (2, 2)]
    for total in range(0, 12):
        cuts = [multihost.process_rows(total, i, 4) for i in range(4)]
        assert cuts[0][0] == 0 and cuts[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False))
    with pytest.raises(ValueError):
        multihost.process_rows(5, 3, 3)


def test_one_process_computes_whole_and_keeps_params():
    calls = []
    out = multihost.split_map(lambda a, b: calls.append((a, b)) or np.arange(a, b), 5)
    assert calls == [(0, 5)] and out.tolist() == [0, 1, 2, 3, 4]
    params = {"w": jax.numpy.ones((2, 3))}
    assert multihost.localize(params) is params and multihost.is_local(params)
    with pytest.raises(KeyError, match="mine"):
        multihost.agree(KeyError("mine"), "step")


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory, dualcse_tiny_run, docent_tiny_run):
    """The inputs of ``tests/two_processes.py``'s multihost phase under a root of this
    module, and ``multihost_worker.py`` as a module."""
    root = two_processes.multihost_inputs(tmp_path_factory.mktemp("multihost"),
                                          dualcse_tiny_run, docent_tiny_run)
    return root, two_processes.load(HERE / "multihost_worker.py")


@pytest.fixture(scope="module")
def single(workdirs):
    """The work of the two-process run's multihost phase in this process alone (8 devices):
    the reference of the two-process test, and the in-process tier's run of it."""
    root, worker = workdirs
    return worker.run(two_processes.multihost_spec(root, "single", 1, 0, 0))


def test_one_process_evaluates_and_exports_every_row_itself(workdirs, single):
    """One process: every phase encodes rows, every file is written by it, and the export
    has the one-file layout."""
    from embedding_core.serving.export_reader import load_export

    root, _ = workdirs
    out = root / "single"
    assert all(n > 0 for n in single["rows"].values()), single["rows"]
    written = {Path(p).relative_to(out).as_posix() for p in single["written"]}
    assert {"dualcse/eval/rte.json", "dualcse/eval/eis.json", "docent/eval/ranking.json",
            "out/dualcse/export.json", "out/docent/export.json"} <= written
    assert not [p for p in written if "/part-" in p]
    for method, views in (("dualcse", ("explicit", "implicit")),
                          ("docent", ("entities", "queries"))):
        exported = load_export(out / "out" / method)
        assert sorted(exported) == sorted(views)
        assert all("parts" not in meta for _, _, meta in exported.values())
    assert json.loads((out / "dualcse/eval/rte.json").read_text())


def _same_export(multi: Path, single: Path) -> None:
    from embedding_core.serving.export_reader import load_export

    a, b = load_export(multi), load_export(single)
    assert sorted(a) == sorted(b)
    for view in a:
        (va, ia, ma), (vb, ib, mb) = a[view], b[view]
        assert ia == ib, view
        np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-6, err_msg=view)
        # One part per process, in process order: rows [0, ceil(n/2)) and the rest.
        n = len(ib)
        assert [p["num_rows"] for p in ma["parts"]] == [(n + 1) // 2, n // 2], view
        assert [p["folder"].split(".")[0] for p in ma["parts"]] == [
            "part-00000-of-00002", "part-00001-of-00002"], view
        assert sorted(p.name for p in (multi / view).iterdir()) == sorted(
            ["meta.json", *(p["folder"] for p in ma["parts"])]), view
        # Paths, the export's own id and time, and the layout differ; the rest is equal.
        for key in ("export_id", "created_utc", "workdir", "input", "parts", "arrays",
                    "format_version", "part_format_version"):
            ma.pop(key, None), mb.pop(key, None)
        assert _named(ma) == _named(mb), view
    names = [p.name for p in multi.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp")], names


def _named(meta: dict) -> dict:
    """``meta`` with its model and training-data paths as their names (under xdist the
    two-process run copied another pytest worker's equal shared runs)."""
    config = dict(meta.get("config", {}))
    for key in ("model", "train_file"):
        if config.get(key):
            config[key] = Path(config[key]).name
    named = {**meta, "config": config}
    if named.get("encoder"):
        named["encoder"] = Path(named["encoder"]).name
    return named


def _results(path: Path, inputs: Path, workdir: Path):
    """A result file with the folders of its inputs, its run's model and training data
    written as names: the two-process run reads equal copies in other folders (under
    xdist, of another pytest worker's shared runs)."""
    config = json.loads((workdir / "run_config.json").read_text())
    text = path.read_text().replace(str(inputs), "INPUTS")
    if config.get("train_file"):
        text = text.replace(str(Path(config["train_file"]).parent), "RUN")
    return json.loads(text.replace(str(config["model"]), "MODEL"))


def _close_json(a, b, tol: float = 1e-6, where: str = "") -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for key in a:
            # ROC-AUC / AP rank every pair against every other: two cosines within float
            # noise of each other (1 vs 2 processes batch differently) may swap, moving
            # the value by 1 / (positives x negatives) per swap; accuracies are exact.
            _close_json(a[key], b[key], 5e-3 if key in ("auc", "ap") else tol,
                        f"{where}/{key}")
    elif isinstance(a, float):
        assert abs(a - b) <= tol, (where, a, b)
    else:
        assert a == b, where


@pytest.mark.slow
def test_two_processes_split_the_work_and_write_one_file_set(workdirs, single, two_processes):
    root, _ = workdirs
    reference = single
    outs = [two_processes.log("multihost", pid) for pid in range(2)]
    # Per-run summaries print once, from process 0.
    for line in ("RTE accuracy (%)", "Zero-shot entity ranking (%)", "wrote "):
        assert line in outs[0] and line not in outs[1], line
    multi, single = two_processes.root / "multihost" / "multi", root / "single"
    reports = [json.loads((multi / f"report_{pid}.json").read_text()) for pid in range(2)]

    # The work is split: each process encodes a part, and the parts add up to the whole.
    for phase, whole in reference["rows"].items():
        parts = [r["rows"][phase] for r in reports]
        assert whole > 0 and all(0 < n < whole for n in parts), (phase, parts, whole)
        assert sum(parts) == whole, (phase, parts, whole)

    # Gathered rows keep their dtype and order; a slice failing on process 1 stops both.
    for r in reports:
        assert r["checks"]["x"] == [i / 3.0 for i in range(7)]  # float64, not narrowed
        assert r["checks"]["x_dtype"] == "float64"
        assert r["checks"]["n"] == [i << 40 for i in range(7)]
    assert reports[1]["checks"]["error"] == "own: division by zero"
    assert reports[0]["checks"]["error"] == \
        "PeerProcessError: check: process 1 failed: division by zero"

    # One file set: process 1 writes only its part of each view, process 0 the rest.
    views = ("dualcse/explicit", "dualcse/implicit", "docent/entities", "docent/queries")
    written = [{Path(p).relative_to(multi).as_posix() for p in r["written"]} for r in reports]
    assert sorted(p.split(".")[0] for p in written[1]) == sorted(
        f"out/{v}/part-00001-of-00002" for v in views), written[1]
    assert {"dualcse/eval/rte.json", "dualcse/eval/eis.json", "docent/eval/ranking.json",
            "out/dualcse/export.json", "out/docent/export.json",
            *(f"out/{v}/meta.json" for v in views)} <= written[0]
    assert sorted(p.split(".")[0] for p in written[0] if "/part-" in p) == sorted(
        f"out/{v}/part-00000-of-00002" for v in views), written[0]

    # The same results and exports as one process.
    for path in ("dualcse/eval/rte.json", "dualcse/eval/eis.json",
                 "docent/eval/ranking.json"):
        method = path.split("/")[0]
        _close_json(_results(multi / path, two_processes.root / "multihost", multi / method),
                    _results(single / path, root, single / method))
    _same_export(multi / "out" / "dualcse", single / "out" / "dualcse")
    _same_export(multi / "out" / "docent", single / "out" / "docent")
