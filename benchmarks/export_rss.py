"""Host memory of a multi-process export as the rows grow: each process writes its own part.

A synthetic model with one table view (row ``i``: a function of ``i``, float32 ``[rows,
--dim]``, ids ``row<i>``, produced ``--block`` rows at a time) is exported with
``embedding_core.serving.serving.export`` by ``--processes`` local processes x ``--devices`` fake
CPU devices each (jax.distributed, gloo), once for ``--small`` rows and once for ``--rows``
rows, each in fresh processes; then by one process (all devices) for ``--rows`` rows.
Each process reports its peak RSS (``resource.getrusage``) and its RSS after the imports
and the distributed start-up. Checks: one manifest (``meta.json`` listing one part per
process), rows in input order, arrays and ids equal to the one-process export. Prints one
line per process and size, the growth from ``--small`` to ``--rows`` against one block's
bytes, and a JSON summary::

    python benchmarks/export_rss.py --rows=1000003 --small=10000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rss import ROOT, peak_rss, rss_now  # noqa: E402,F401 (sets the environment)


class Synthetic:
    """What ``serving.export`` needs of an ``Encoder``: one table view, no texts."""

    name, step, default_normalize = "synthetic", 0, False

    def __init__(self, rows: int, dim: int, block: int):
        import ml_collections
        import numpy as np

        from embedding_core.serving.serving import View

        self.np, self.rows, self.dim, self.block = np, rows, dim, block
        self.config = ml_collections.ConfigDict({"rows": rows, "dim": dim})
        self.views = (View("table", "dot", encode_kwargs=None, table=True),)

    def export_meta(self) -> dict:
        return {}

    def view_dim(self, name: str) -> int:
        return self.dim

    def rows_of(self, start: int, stop: int):
        np = self.np
        # One [rows, dim] float32 array a block, computed in place: the producer's own
        # temporaries stay out of the export's memory.
        rows = np.arange(start, stop, dtype=np.float32)[:, None] * np.float32(0.37)
        rows = rows + np.arange(self.dim, dtype=np.float32)[None, :] * np.float32(1.3)
        return np.sin(rows, out=rows)

    def table(self, name: str, normalize: bool):
        def blocks():
            for a in range(0, self.rows, self.block):
                b = min(a + self.block, self.rows)
                yield [f"row{i}" for i in range(a, b)], self.rows_of(a, b)

        return self.rows, blocks()


def _worker(args) -> None:
    from embedding_core.distributed import parallel

    if args.processes > 1:
        parallel.maybe_initialize_distributed(args.coordinator, args.processes, args.process_id)
    import jax

    from embedding_core.serving import serving

    jax.devices()
    after_start = rss_now()
    t0 = time.perf_counter()
    serving.export(lambda: Synthetic(args.rows, args.dim, args.block), args.out)
    print(json.dumps({"process": jax.process_index(), "devices": jax.local_device_count(),
                      "after_start": after_start, "seconds": time.perf_counter() - t0,
                      "peak_rss": peak_rss()}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _export(args, rows: int, processes: int, out: Path) -> list[dict]:
    port = _free_port()
    devices = args.devices if processes > 1 else args.devices * args.processes
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", f"--rows={rows}", f"--dim={args.dim}",
         f"--block={args.block}", f"--processes={processes}", f"--process_id={pid}",
         f"--coordinator=localhost:{port}", f"--out={out}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for pid in range(processes)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode:
            raise SystemExit(f"export worker failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def _check(args, multi: Path, single: Path, rows: int) -> dict:
    import numpy as np

    from embedding_core.serving.export_reader import load_export

    (a, ids_a, meta_a), = load_export(multi, mmap_mode="r").values()
    (b, ids_b, meta_b), = load_export(single, mmap_mode="r").values()
    want = Synthetic(rows, args.dim, args.block)
    first_block = want.rows_of(0, min(rows, 1000))
    return {
        "parts": [p["num_rows"] for p in meta_a["parts"]],
        "one_manifest": sorted(p.name for p in multi.iterdir()) == sorted(
            ["meta.json", *(p["folder"] for p in meta_a["parts"])]),
        "ids_in_input_order": ids_a == [f"row{i}" for i in range(rows)],
        "equal_to_one_process": bool(ids_a == ids_b and np.array_equal(a, b)),
        "rows_as_produced": bool(np.array_equal(a[:len(first_block)], first_block)),
        "one_process_layout": "parts" not in meta_b,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_003)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=8192, help="rows per produced block")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=4, help="fake CPU devices a process")
    parser.add_argument("--workdir", default=None, help="where the exports go (default tmp)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--process_id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="export_rss."))
    block_bytes = args.block * args.dim * 4
    summary = {"settings": {k: v for k, v in vars(args).items()
                            if k in ("rows", "small", "dim", "block", "processes", "devices")},
               "block_bytes": block_bytes, "runs": {}}
    for rows in (args.small, args.rows):
        runs = _export(args, rows, args.processes, workdir / f"multi_{rows}")
        summary["runs"][rows] = runs
        for r in runs:
            print(f"{rows:>9} rows  process {r['process']} of {args.processes} x "
                  f"{r['devices']} devices  peak RSS {r['peak_rss'] / 2**20:8.1f} MiB  (after "
                  f"start-up {r['after_start'] / 2**20:7.1f} MiB, export {r['seconds']:.1f} s)",
                  flush=True)
    single = _export(args, args.rows, 1, workdir / f"single_{args.rows}")[0]
    summary["single"] = single
    print(f"{args.rows:>9} rows  one process x {single['devices']} devices  peak RSS "
          f"{single['peak_rss'] / 2**20:8.1f} MiB  (export {single['seconds']:.1f} s)")
    growth = [big["peak_rss"] - small["peak_rss"] for small, big in
              zip(summary["runs"][args.small], summary["runs"][args.rows], strict=True)]
    summary["growth"] = growth
    array_bytes = args.rows * args.dim * 4
    print(f"block: {args.block} rows x {args.dim} float32 = {block_bytes / 2**20:.2f} MiB; "
          f"whole result {array_bytes / 2**20:.1f} MiB")
    for pid, g in enumerate(growth):
        print(f"process {pid}: peak RSS {args.small} -> {args.rows} rows grew "
              f"{g / 2**20:+.2f} MiB = {g / block_bytes:+.2f} blocks "
              f"({g / array_bytes:+.3f} x the whole result)")
    summary["checks"] = _check(args, workdir / f"multi_{args.rows}" / "table",
                               workdir / f"single_{args.rows}" / "table", args.rows)
    summary["checks"]["multi"] = str(workdir / f"multi_{args.rows}")
    print("checks: " + ", ".join(f"{k}={v}" for k, v in summary["checks"].items()))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
