"""One process of the multi-process evaluation/export test (``test_multihost.py``).

argv: spec.json — {"coordinator", "num_processes", "process_id", "dualcse": workdir,
"val_file" and "test_file": its RTE files, "docent": workdir, "ranking_queries": its
evaluation queries (JSON Lines), "sentences": file, "queries": file, "out": folder,
"report": file}.
:func:`run` (also called in the test's own process for the single-process reference) runs
DualCSE's RTE/EIS evaluation and export, then DocEnt's ranking evaluation (with its
baselines) and export, and returns the rows this process encoded per phase and the files
this process wrote.
"""

import contextlib
import json
import sys


@contextlib.contextmanager
def recorded(written: list[str]):
    """Every result file and export view this process writes is appended to ``written``;
    restored on exit."""
    from embedding_core.serving import export
    from embedding_core.storage import files

    saved = (files.write_bytes_atomic, export.EmbeddingWriter.__enter__)
    plain_write, plain_enter = saved

    def write(path, data):
        written.append(str(path))
        plain_write(path, data)

    def enter(self):
        written.append(str(self.out_dir))
        return plain_enter(self)

    files.write_bytes_atomic = write
    export.EmbeddingWriter.__enter__ = enter
    try:
        yield
    finally:
        files.write_bytes_atomic, export.EmbeddingWriter.__enter__ = saved


def run(spec: dict) -> dict:
    """Evaluates and exports both workdirs of ``spec``; see the module docstring."""
    from docent_jax import workflows as docent_workflows
    from dualcse_jax import workflows as dualcse_workflows
    from embedding_core.serving import inference

    written: list[str] = []
    rows = {}
    out = spec["out"]
    phases = {
        "dualcse_evaluate": lambda: dualcse_workflows.evaluate_workdir(
            spec["dualcse"], progress=False,
            overrides={"val_file": spec["val_file"], "test_file": spec["test_file"]}),
        "dualcse_export": lambda: dualcse_workflows.export_workdir(
            spec["dualcse"], spec["sentences"], f"{out}/dualcse", chunk=16),
        "docent_evaluate": lambda: docent_workflows.evaluate_workdir(
            spec["docent"], progress=False,
            overrides={"eval_queries_file": spec["ranking_queries"]}),
        "docent_export": lambda: docent_workflows.export_workdir(
            spec["docent"], f"{out}/docent", input_path=spec["queries"], block_rows=4),
    }
    with recorded(written):
        for name, phase in phases.items():
            before = inference.encoded_rows()
            phase()
            rows[name] = inference.encoded_rows() - before
    return {"rows": rows, "written": written}


def gather_checks() -> dict:
    """split_map on values JAX would narrow (float64, int64), and a slice that fails on
    process 1 only: what every process gets back."""
    import jax
    import numpy as np

    from embedding_core.distributed import multihost

    out = multihost.split_map(lambda a, b: {"x": np.arange(a, b) / 3.0,
                                            "n": np.arange(a, b, dtype=np.int64) << 40}, 7)
    try:
        multihost.split_map(lambda a, b: 1 / (jax.process_index() == 0) and
                            np.zeros((b - a, 2)), 7, what="check")
        error = None
    except ZeroDivisionError as err:
        error = f"own: {err}"
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    return {"x": out["x"].tolist(), "x_dtype": str(out["x"].dtype), "n": out["n"].tolist(),
            "error": error}


def _generous_distributed_timeouts() -> None:
    """jax.distributed's start-up and shut-down barriers get 30 min instead of 5: on a
    loaded machine one process may reach them long after the other (a hang guard only)."""
    import functools

    import jax

    jax.distributed.initialize = functools.partial(
        jax.distributed.initialize, initialization_timeout=1800, shutdown_timeout_seconds=1800)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    _generous_distributed_timeouts()
    from embedding_core.distributed import parallel

    parallel.maybe_initialize_distributed(spec["coordinator"], spec["num_processes"],
                                          spec["process_id"])
    report = run(spec)
    report["checks"] = gather_checks()
    with open(spec["report"], "w", encoding="utf-8") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
