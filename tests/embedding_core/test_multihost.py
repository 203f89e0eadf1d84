"""Several processes split evaluation and export: each encodes its slice, one writes.

The 2-process test runs DualCSE's RTE/EIS evaluation and export and DocEnt's ranking
evaluation (with baselines) and export on 2 processes x 4 CPU devices (jax.distributed,
gloo) and on 1 process x 8 devices, from the same trained workdirs, and compares: rows
encoded per process (their sum is the single process's count, so no row is encoded
twice), the evaluation files, the export folders, and which process wrote files.
"""

import csv
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.distributed import multihost

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _load_worker():
    spec = importlib.util.spec_from_file_location("multihost_worker",
                                                  HERE / "multihost_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


def _rte_file(path: Path, split: str, rows: int) -> Path:
    from data_pipelines import inli

    fields = ["premise", "explicit_entailment", "implied_entailment", "neutral",
              "contradiction"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for ex in inli.read_inli(inli.inli_split_path(split))[:rows]:
            writer.writerow([getattr(ex, name) for name in fields])
    return path


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory, dualcse_tiny_run, docent_tiny_run):
    """Copies of the session's shared DualCSE and DocEnt-Dual runs (tests/shared_runs.py),
    their evaluation files (RTE: 24 val and 24 test rows; DocEnt: 10 ranking queries of
    one or two entities), and the texts to export."""
    from tests.shared_runs import DOCENT_WORDS

    root = tmp_path_factory.mktemp("multihost")
    shutil.copytree(dualcse_tiny_run.workdir, root / "dualcse")
    shutil.copytree(docent_tiny_run.workdir, root / "docent")
    _rte_file(root / "val.csv", "val", 24)
    _rte_file(root / "test.csv", "test", 24)
    words = DOCENT_WORDS
    queries = [(f"which one has a {w}?", [f"E_{w}"]) for w in words]
    queries += [(f"a long question about the {w} and the {v} nearby", [f"E_{w}", f"E_{v}"])
                for w, v in zip(words, words[1:] + words[:1], strict=True)]
    (root / "ranking_queries.jsonl").write_text("".join(
        json.dumps({"query": q, "entities": e}) + "\n" for q, e in queries))
    worker = _load_worker()
    from data_pipelines import inli

    premises = [ex.premise for ex in inli.read_inli(inli.inli_split_path("test"))[:24]]
    (root / "sentences.txt").write_text("".join(f"{p}\n" for p in premises))
    (root / "queries.txt").write_text("".join(f"{q}\n" for q in [
        "river", "the castle at night", "music", "which engine?", "a forest",
        "a river and a castle", "engine music", "forest river castle"]))
    return root, worker


def _spec(root: Path, name: str, nproc: int, pid: int, port: int) -> dict:
    base = root / name
    if pid == 0:
        for method in ("dualcse", "docent"):  # each setting writes eval/ into its own copy
            shutil.copytree(root / method, base / method)
    return {"coordinator": f"localhost:{port}", "num_processes": nproc, "process_id": pid,
            "dualcse": str(base / "dualcse"), "docent": str(base / "docent"),
            "val_file": str(root / "val.csv"), "test_file": str(root / "test.csv"),
            "ranking_queries": str(root / "ranking_queries.jsonl"),
            "sentences": str(root / "sentences.txt"), "queries": str(root / "queries.txt"),
            "out": str(base / "out"), "report": str(base / f"report_{pid}.json")}


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
        assert ma == mb, view
    names = [p.name for p in multi.rglob("*")]
    assert not [n for n in names if n.endswith(".tmp")], names


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
def test_two_processes_split_the_work_and_write_one_file_set(workdirs):
    root, worker = workdirs
    port = _free_port()
    # The persistent compile cache also serves a second load() of the same model in one
    # worker (a new jit object), hence no minimum compile time.
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir)
    procs = []
    for pid in range(2):
        path = root / f"spec_{pid}.json"
        path.write_text(json.dumps(_spec(root, "multi", 2, pid, port)))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "multihost_worker.py"), str(path)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    # The reference: this process alone (8 devices), while the two run.
    reference = worker.run(_spec(root, "single", 1, 0, port))
    outs = []
    for p in procs:
        outs.append(p.communicate(timeout=1800)[0])
        assert p.returncode == 0, outs[-1][-4000:]
    # Per-run summaries print once, from process 0.
    for line in ("RTE accuracy (%)", "Zero-shot entity ranking (%)", "wrote "):
        assert line in outs[0] and line not in outs[1], line
    multi, single = root / "multi", root / "single"
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
        _close_json(json.loads((multi / path).read_text()),
                    json.loads((single / path).read_text()))
    _same_export(multi / "out" / "dualcse", single / "out" / "dualcse")
    _same_export(multi / "out" / "docent", single / "out" / "docent")
