"""Host memory and speed of ``embedding-jax search`` as the corpus grows, against faiss.

Synthetic exports of ``--small`` and ``--rows`` rows x ``--dim`` float32 (row blocks drawn
from a seeded generator, written once under ``--dir`` and reused) are searched by
``--queries`` random queries for the top ``--top_k`` (cos), each search in a fresh Python
process: ``ours`` (``embedding_core.serving.search``, the export streamed in
``--chunk_rows`` chunks over ``--devices`` CPU devices) and, if ``faiss`` imports,
``faiss`` (``IndexFlatIP`` over the L2-normalised corpus, loaded whole: what faiss needs).
Each process reports its peak RSS (``resource.getrusage``), its RSS after the imports,
the load and search seconds and queries/s; the two top-k lists are compared (the share of
identical ids). Prints one line per run and a JSON summary::

    python benchmarks/search_bench.py --rows=2000000 --small=20000 --dir=/tmp/search_bench
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rss import ROOT, peak_rss, rss_now  # noqa: E402,F401 (sets the environment)

BLOCK = 50_000


def write_corpus(folder: Path, rows: int, dim: int) -> None:
    """A view export of ``rows`` Gaussian rows (block ``b`` from seed ``b``), once."""
    import numpy as np

    from embedding_core.serving import export

    meta = folder / "meta.json"
    if meta.is_file() and json.loads(meta.read_text())["num_rows"] == rows:
        return

    def blocks():
        for b, a in enumerate(range(0, rows, BLOCK)):
            n = min(BLOCK, rows - a)
            yield ([f"doc{i}" for i in range(a, a + n)],
                   np.random.default_rng(b).standard_normal((n, dim), np.float32))

    export.export_view(folder, blocks(), num_rows=rows, dim=dim, split=False,
                       meta={"model": "synthetic", "config": {}, "step": None,
                             "normalized": False, "similarity": "cosine"})


def queries(n: int, dim: int):
    import numpy as np

    return np.random.default_rng(12345).standard_normal((n, dim), np.float32)


def unit(x):
    """Rows L2-normalised into a new array (``faiss.normalize_L2`` works in place: on a
    read-only memory map's rows it segfaults)."""
    import numpy as np

    return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12),
                                np.float32)


def run_ours(args, folder: str) -> dict:
    import jax

    from embedding_core.serving import search

    jax.devices()
    after_imports = rss_now()
    t0 = time.perf_counter()
    corpus = search.Corpus(folder)
    q = queries(args.queries, corpus.dim)
    t1 = time.perf_counter()
    scores, rows = search.search(q, corpus, args.top_k, chunk_rows=args.chunk_rows,
                                 query_batch=args.queries)
    t2 = time.perf_counter()
    return {"rows": rows.tolist(), "load_s": t1 - t0, "search_s": t2 - t1,
            "devices": len(jax.local_devices()), "after_imports": after_imports}


def run_faiss(args, folder: str) -> dict:
    import faiss
    import numpy as np

    from embedding_core.serving import export_reader

    after_imports = rss_now()
    t0 = time.perf_counter()
    arrays, _, _ = export_reader.load_arrays(folder, mmap_mode="r")
    corpus = arrays["embeddings"]
    index = faiss.IndexFlatIP(corpus.shape[1])
    for a in range(0, len(corpus), BLOCK):  # faiss copies the rows into the index
        index.add(unit(np.asarray(corpus[a:a + BLOCK], np.float32)))
    q = unit(queries(args.queries, corpus.shape[1]))
    t1 = time.perf_counter()
    _, rows = index.search(q, args.top_k)
    t2 = time.perf_counter()
    return {"rows": rows.tolist(), "load_s": t1 - t0, "search_s": t2 - t1,
            "threads": faiss.omp_get_max_threads(), "after_imports": after_imports}


def child(args) -> None:
    out = (run_ours if args.child == "ours" else run_faiss)(args, args.folder)
    out["peak_rss"] = peak_rss()
    print("RESULT " + json.dumps(out))


def spawn(args, which: str, folder: Path) -> dict:
    env_flags = f"--xla_force_host_platform_device_count={args.devices}"
    cmd = [sys.executable, __file__, f"--child={which}", f"--folder={folder}",
           f"--queries={args.queries}", f"--top_k={args.top_k}",
           f"--chunk_rows={args.chunk_rows}"]
    import os

    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {env_flags}"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{which} on {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--small", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--top_k", type=int, default=10)
    p.add_argument("--chunk_rows", type=int, default=65536)
    p.add_argument("--devices", type=int, default=1, help="fake CPU devices of our search")
    p.add_argument("--dir", default="/tmp/search_bench")
    p.add_argument("--no_faiss", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    try:
        import faiss  # noqa: F401
        have_faiss = not args.no_faiss
    except ImportError:
        have_faiss = False
        print("faiss does not import: its runs are skipped (pip install faiss-cpu)")
    summary = []
    for rows in (args.small, args.rows):
        folder = Path(args.dir) / f"corpus_{rows}x{args.dim}"
        t0 = time.perf_counter()
        write_corpus(folder, rows, args.dim)
        print(f"corpus {rows:,} x {args.dim}: {folder} ({time.perf_counter() - t0:.0f} s to "
              "write or check)", flush=True)
        results = {"ours": spawn(args, "ours", folder)}
        if have_faiss:
            results["faiss"] = spawn(args, "faiss", folder)
        for name, r in results.items():
            r["qps"] = args.queries / r["search_s"]
            print(f"  {name:5s} rows={rows:>9,}  peak RSS {r['peak_rss'] / 2**20:8.0f} MiB  "
                  f"(after imports {r['after_imports'] / 2**20:6.0f} MiB)  load "
                  f"{r['load_s']:6.1f} s  search {r['search_s']:7.1f} s  "
                  f"{r['qps']:9.1f} queries/s", flush=True)
        entry = {"rows": rows, "dim": args.dim, "queries": args.queries, "top_k": args.top_k,
                 **{f"{n}_{k}": v for n, r in results.items() for k, v in r.items()
                    if k != "rows"}}
        if "faiss" in results:
            same = sum(a == b for x, y in zip(results["ours"]["rows"], results["faiss"]["rows"],
                                              strict=True) for a, b in zip(x, y, strict=True))
            entry["same_ids"] = same / (args.queries * args.top_k)
            print(f"  identical top-{args.top_k} ids ours vs faiss: {entry['same_ids']:.4%}")
        summary.append(entry)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
