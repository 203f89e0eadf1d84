"""The slow tier's one two-process run (session fixture ``two_processes``,
tests/conftest.py): 2 processes x 4 CPU devices start ``tests/two_process_worker.py`` once
per test run, for all pytest workers (a file lock: the first runs it, the others read its
files), and six tests read its results: test_multihost.py, test_export_parts.py,
test_parallel.py, test_sharded_corpus.py, test_bulk_encode.py, test_search.py. Each
compares against the same work done in its own (8-device) process.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
REPO = HERE.parent
EXPORT_ROWS = 11  # odd: the export parts hold 6 and 5 rows
# (k, score, chunk_rows, row_block) of the search phase over 37 rows: chunks of 8 put
# chunks 0, 2, 4 on process 0 and 1, 3 on process 1; 1000 rows make one chunk, so that
# process 1 ranks none.
SEARCH_CASES = [(10, "cos", 8, 3), (37, "dot", 8, 0), (5, "cos", 1000, 4)]
SEARCH_NAN_ROW = 9  # in chunk 1: process 1's


def load(path: Path):
    """A test helper module by path (the worker modules are no package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


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


def multihost_inputs(root: Path, dualcse_run, docent_run) -> Path:
    """Copies of the shared DualCSE and DocEnt-Dual runs under ``root``, their evaluation
    files (RTE: 24 val and 24 test rows; DocEnt: 10 ranking queries of one or two
    entities), and the texts to export."""
    from data_pipelines import inli
    from tests.shared_runs import DOCENT_WORDS

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(dualcse_run.workdir, root / "dualcse")
    shutil.copytree(docent_run.workdir, root / "docent")
    _rte_file(root / "val.csv", "val", 24)
    _rte_file(root / "test.csv", "test", 24)
    words = DOCENT_WORDS
    queries = [(f"which one has a {w}?", [f"E_{w}"]) for w in words]
    queries += [(f"a long question about the {w} and the {v} nearby", [f"E_{w}", f"E_{v}"])
                for w, v in zip(words, words[1:] + words[:1], strict=True)]
    (root / "ranking_queries.jsonl").write_text("".join(
        json.dumps({"query": q, "entities": e}) + "\n" for q, e in queries))
    premises = [ex.premise for ex in inli.read_inli(inli.inli_split_path("test"))[:24]]
    (root / "sentences.txt").write_text("".join(f"{p}\n" for p in premises))
    (root / "queries.txt").write_text("".join(f"{q}\n" for q in [
        "river", "the castle at night", "music", "which engine?", "a forest",
        "a river and a castle", "engine music", "forest river castle"]))
    return root


def multihost_spec(root: Path, name: str, nproc: int, pid: int, port: int) -> dict:
    """The spec of ``multihost_worker.run`` for the setting ``name`` (its own copies of the
    workdirs: evaluation writes ``eval/`` into them)."""
    base = root / name
    if pid == 0:
        for method in ("dualcse", "docent"):
            shutil.copytree(root / method, base / method)
    return {"coordinator": f"localhost:{port}", "num_processes": nproc, "process_id": pid,
            "dualcse": str(base / "dualcse"), "docent": str(base / "docent"),
            "val_file": str(root / "val.csv"), "test_file": str(root / "test.csv"),
            "ranking_queries": str(root / "ranking_queries.jsonl"),
            "sentences": str(root / "sentences.txt"), "queries": str(root / "queries.txt"),
            "out": str(base / "out"), "report": str(base / f"report_{pid}.json")}


def export_inputs(root: Path) -> Path:
    """9 texts in ``in.txt``; ``bad.txt``'s 8th is ``NaN`` (process 1's rows)."""
    root.mkdir(parents=True, exist_ok=True)
    texts = [f"text number {i}" for i in range(9)]
    (root / "in.txt").write_text("".join(f"{t}\n" for t in texts))
    (root / "bad.txt").write_text("".join(f"{t}\n" for t in texts[:7] + ["NaN", "x"]))
    return root


def export_spec(root: Path, name: str, nproc: int, pid: int, port: int) -> dict:
    return {"coordinator": f"localhost:{port}", "num_processes": nproc, "process_id": pid,
            "rows": EXPORT_ROWS, "input": str(root / "in.txt"),
            "bad_input": str(root / "bad.txt"), "out": str(root / name),
            "report": str(root / f"{name}_{pid}.json")}


def search_vectors() -> tuple[np.ndarray, np.ndarray]:
    """``(corpus [37, 8], queries [9, 8])`` float32: row 3 repeated in chunks of both
    processes (exact ties across them), doubled (a cos tie), two zero rows; the last two
    queries are row 3 and a zero row (every score ties)."""
    rng = np.random.default_rng(40)
    corpus = rng.normal(size=(37, 8)).astype(np.float32)
    corpus[[5, 12, 20, 27, 36]] = corpus[3]
    corpus[30] = corpus[3] * 2
    corpus[[7, 15]] = 0
    queries = np.concatenate([rng.normal(size=(7, 8)).astype(np.float32), corpus[[3, 7]]])
    return corpus, queries


def search_inputs(root: Path) -> dict:
    """The search phase's corpus (a 3-part manifest) and queries export under ``root``."""
    writer = load(HERE / "embedding_core" / "test_search.py")
    corpus, queries = search_vectors()
    root.mkdir(parents=True, exist_ok=True)
    return {"corpus": str(writer.write_export(root / "corpus", corpus, parts=3)),
            "queries": str(writer.write_export(root / "queries", queries,
                                               [f"q{i}" for i in range(len(queries))]))}


def bulk_lines(path: Path) -> tuple[Path, list[str]]:
    """300 INLI test texts (premise, neutral), one a line."""
    from data_pipelines import inli

    rows = inli.read_inli(inli.inli_split_path("test"))[:150]
    texts = [t for r in rows for t in (r.premise, r.neutral)][:300]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(t + "\n" for t in texts))
    return path, texts


def bulk_args(model, path, out, *extra) -> list[str]:
    """``embedding-jax encode``'s flags: blocks of 40 rows, batches of 16, 32 tokens."""
    return [f"--model={model}", f"--input={path}", f"--output={out}",
            "--block_rows=40", "--batch_size=16", "--max_seq_length=32", *extra]


@dataclasses.dataclass(frozen=True)
class Run:
    """The shared run's folder: ``<phase>/`` inputs and outputs, ``logs/<phase>_<pid>.log``."""

    root: Path

    def log(self, phase: str, pid: int) -> str:
        return (self.root / "logs" / f"{phase}_{pid}.log").read_text(encoding="utf-8")

    def report(self, phase: str, pid: int) -> dict:
        return json.loads((self.root / phase / f"report_{pid}.json").read_text())


def _specs(root: Path, port: int, tiny_bert_dir: Path, dualcse_run, docent_run,
           sharded_folder: Path, sharded_overrides: dict) -> list[dict]:
    multihost_inputs(root / "multihost", dualcse_run, docent_run)
    export_inputs(root / "export_parts")
    lines, _ = bulk_lines(root / "bulk_encode" / "texts.txt")
    found = search_inputs(root / "search")
    specs = []
    for pid in range(2):
        export = export_spec(root / "export_parts", "multi", 2, pid, port)
        export["report"] = str(root / "export_parts" / f"report_{pid}.json")
        specs.append({
            "coordinator": f"localhost:{port}", "num_processes": 2, "process_id": pid,
            "logs": str(root / "logs"),
            "multihost": multihost_spec(root / "multihost", "multi", 2, pid, port),
            "export_parts": export,
            "dualcse_train": {"overrides": dualcse_run.overrides,
                              "workdir": str(root / "dualcse_train" / "run"),
                              "out": str(root / "dualcse_train" / "params.npz")},
            "sharded": {"overrides": {**sharded_overrides, "train_shards": str(sharded_folder)},
                        "workdir": str(root / "sharded" / "run"),
                        "out": str(root / "sharded" / f"host_{pid}.npz")},
            "bulk_encode": {"argv": bulk_args(tiny_bert_dir, lines,
                                              root / "bulk_encode" / "two"),
                            "report": str(root / "bulk_encode" / f"report_{pid}.json")},
            "search": {**found, "cases": SEARCH_CASES, "nan_row": SEARCH_NAN_ROW,
                       "out": str(root / "search" / f"result_{pid}.npz"),
                       "report": str(root / "search" / f"report_{pid}.json"),
                       "argv": [f"--corpus={found['corpus']}", f"--queries={found['queries']}",
                                f"--output={root / 'search' / 'run.jsonl'}", "--top_k=10",
                                "--chunk_rows=8", "--query_batch=4",
                                f"--coordinator_address=localhost:{port}",
                                "--num_processes=2", f"--process_id={pid}"]}})
    return specs


def _launch(root: Path, specs: list[dict]) -> None:
    import jax

    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "dualcse_train").mkdir(exist_ok=True)
    (root / "sharded").mkdir(exist_ok=True)
    # The persistent compile cache also serves a second load() of the same model in one
    # worker (a new jit object), hence no minimum compile time.
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for pid, spec in enumerate(specs):
        path = root / f"spec_{pid}.json"
        path.write_text(json.dumps(spec))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "two_process_worker.py"), str(path)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO))
    outs = [p.communicate(timeout=3600)[0] for p in procs]  # a hang guard only
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]


def shared(tmp_path_factory, tiny_bert_dir: Path, dualcse_run, docent_run) -> Run:
    """The run, started by the first pytest worker that asks (the others wait and read)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this test run
    root = base / "two_processes"
    with FileLock(str(root) + ".lock"):
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            sharded = load(HERE / "data_pipelines" / "test_sharded_corpus.py")
            folder = sharded.build_corpus(root / "sharded" / "corpus", tiny_bert_dir)[0]
            overrides = {**sharded.overrides(tiny_bert_dir), "num_train_steps": sharded.STEPS}
            _launch(root, _specs(root, free_port(), tiny_bert_dir, dualcse_run, docent_run,
                                 folder, overrides))
            (root / "done").write_text("")
    return Run(root)
