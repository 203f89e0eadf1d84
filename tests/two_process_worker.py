"""One process of the slow tier's shared two-process run (``tests/two_processes.py``).

argv: spec.json — {"coordinator", "num_processes", "process_id", "logs": folder, and one
entry per phase}. Starts ``jax.distributed`` once (gloo, 4 CPU devices a process), then
runs the phases in order, each phase's stdout, stderr and log lines in
``logs/<phase>_<pid>.log``:

- ``multihost``: ``tests/embedding_core/multihost_worker.py``'s evaluation and export of a
  DualCSE and a DocEnt workdir, and its gather checks; a JSON report.
- ``export_parts``: ``tests/embedding_core/export_worker.py``'s synthetic exports.
- ``dualcse_train``: DualCSE trains 3 steps; process 0 saves the parameters (npz).
- ``sharded``: DualCSE trains on a sharded corpus, recording the host batches it consumed
  and the shard files this process held open (npz).
- ``bulk_encode``: ``embedding-jax encode`` of a text file.
- ``search``: ``search.search`` of a 3-part corpus export (the results and the row ranges
  this process read, npz), one whose row on process 1 is NaN (the errors), and
  ``embedding-jax search`` writing a run (process 0).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def captured(log: Path):
    """stdout, stderr and absl's log lines of the block into ``log``."""
    from absl import logging

    handler = logging.get_absl_handler().python_handler
    with open(log, "w", encoding="utf-8") as out:
        saved = handler.stream
        handler.stream = out
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                yield
        finally:
            handler.stream = saved


def _dualcse_config(overrides: dict):
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update(overrides)
    return config


def dualcse_train(spec: dict) -> None:
    """Trains ``spec["overrides"]`` into ``spec["workdir"]``; process 0 saves the gathered
    parameters by keystr path to ``spec["out"]``."""
    import jax
    from jax.experimental import multihost_utils

    from dualcse_jax.trainer import train

    state = train(_dualcse_config(spec["overrides"]), spec["workdir"])
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if jax.process_index() == 0:
        np.savez(spec["out"], **{jax.tree_util.keystr(k): np.asarray(v)
                                 for k, v in jax.tree_util.tree_leaves_with_path(params)})


def open_files_under(folder: str) -> list[str]:
    """Names of the files under ``folder`` this process has open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed between listing and reading
        if os.path.dirname(target) == os.path.realpath(folder):
            names.append(os.path.basename(target))
    return sorted(set(names))


def sharded_train(spec: dict) -> None:
    """Trains on ``overrides["train_shards"]``; saves ``step_<s>_<key>`` host batches,
    ``open_files`` (while batches are read), ``process_index`` and ``local_devices``."""
    import jax

    from dualcse_jax import trainer

    config = _dualcse_config(spec["overrides"])
    recorded: dict[str, np.ndarray] = {}
    build_task = trainer.build_task

    def recording_task(config, mesh):
        task = build_task(config, mesh)
        make = task.make_batches

        def make_batches(start_step):
            for batch in make(start_step):
                step = int(batch["step"])
                for key, value in batch.items():
                    recorded[f"step_{step}_{key}"] = np.asarray(value)
                if "open_files" not in recorded:
                    recorded["open_files"] = np.array(open_files_under(config.train_shards))
                yield batch

        task.make_batches = make_batches
        return task

    trainer.build_task = recording_task  # train() looks the name up when it runs
    try:
        trainer.train(config, spec["workdir"])
    finally:
        trainer.build_task = build_task
    recorded["process_index"] = np.array(jax.process_index())
    recorded["local_devices"] = np.array(jax.local_device_count())
    np.savez(spec["out"], **recorded)


def search_phase(spec: dict) -> None:
    """``spec["cases"]`` searched: ``scores_<n>``, ``rows_<n>`` and ``read_<n>`` (the
    ``[a, b)`` row ranges read) into ``spec["out"]``; the report: the CLI's ``rc`` and the
    error of a corpus holding NaN at ``spec["nan_row"]``."""
    from embedding_core.serving import search, search_cli

    corpus = search.Corpus(spec["corpus"])
    _, queries = search_cli.read_queries(spec["queries"], None, 1)
    read, seen, out = search.Corpus.read, [], {}

    def recording(self, a, b):
        seen.append([a, b])
        return read(self, a, b)

    search.Corpus.read = recording
    try:
        for n, (k, score, chunk, block) in enumerate(spec["cases"]):
            seen.clear()
            s, i = search.search(queries, corpus, k, score=score, chunk_rows=chunk,
                                 row_block=block, query_batch=4)
            out.update({f"scores_{n}": s, f"rows_{n}": i,
                        f"read_{n}": np.array(seen, np.int64).reshape(-1, 2)})
    finally:
        search.Corpus.read = read
    np.savez(spec["out"], **out)
    bad = corpus.read(0, corpus.num_rows)
    bad[spec["nan_row"]] = np.nan
    try:
        search.search(queries, bad, 3, chunk_rows=8)
        error = ""
    except ValueError as err:
        error = str(err)
    _write(spec["report"], {"rc": search_cli.main(spec["argv"]), "nan_error": error})


def _write(path: str, report: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    import jax

    # The start-up and shut-down barriers get 30 min instead of 5: on a loaded machine one
    # process may reach them long after the other (a hang guard only).
    jax.distributed.initialize = functools.partial(
        jax.distributed.initialize, initialization_timeout=1800, shutdown_timeout_seconds=1800)
    from embedding_core.distributed import parallel
    from embedding_core.serving import bulk_encode

    parallel.maybe_initialize_distributed(spec["coordinator"], spec["num_processes"],
                                          spec["process_id"])
    pid = spec["process_id"]
    multihost = _module(HERE / "embedding_core" / "multihost_worker.py")
    export = _module(HERE / "embedding_core" / "export_worker.py")

    def multihost_phase(s):
        report = multihost.run(s)
        report["checks"] = multihost.gather_checks()
        _write(s["report"], report)

    phases = {
        "multihost": multihost_phase,
        "export_parts": lambda s: _write(s["report"], export.run(s)),
        "dualcse_train": dualcse_train,
        "sharded": sharded_train,
        "bulk_encode": lambda s: _write(s["report"], {"rc": bulk_encode.main(s["argv"])}),
        "search": search_phase,
    }
    for name, phase in phases.items():
        with captured(Path(spec["logs"]) / f"{name}_{pid}.log"):
            phase(spec[name])


if __name__ == "__main__":
    main()
