"""Host memory of training input as the corpus grows: sharded streaming vs the in-memory table.

A synthetic corpus of ``--rows`` rows (DocEnt-like: one field, ``--max_length`` tokens at
most, lengths uniform in [8, max_length], row i's tokens a function of i) and one
``--factor`` times larger are each preprocessed into ``--num_shards`` ArrayRecord shards
(``data_pipelines.sharded_corpus.write_corpus``, as ``preprocess`` does). Then, each in a
fresh Python process, one full epoch of global batches of ``--batch`` rows is read:

* ``stream``: ``pipeline.make_batches`` from the shard files (host 0 of
  ``--processes``: it opens only its shards and yields its slice of every batch);
* ``in_memory``: the token table built in RAM (what every host holds today) and
  ``pipeline.make_batches`` over it.

Each process reports its peak RSS (``resource.getrusage``, which includes the ~0.5 GB of
TensorFlow and numpy imports) and the RSS right after the imports, so the growth is what
the data costs. Preprocessing's own peak RSS is reported too. Prints one line per
measurement and a JSON summary::

    python benchmarks/sharded_corpus_rss.py --rows=20000 --factor=10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rss import ROOT, peak_rss, rss_now  # noqa: E402,F401 (sets the environment)


def _table(rows, max_length: int):
    """The synthetic rows ``rows`` (any subset, any order): a pure function of the index."""
    import numpy as np

    from data_pipelines.table import TokenTable

    rows = np.asarray(rows, np.int64)
    lengths = (8 + (rows * 2654435761) % (max_length - 7)).astype(np.int32)[:, None]
    positions = np.arange(max_length)
    ids = (1000 + (rows[:, None] * 31 + positions[None, :] * 7) % 29000).astype(np.int32)
    ids[:, 0], ids[np.arange(len(rows)), lengths[:, 0] - 1] = 101, 102
    ids[positions[None, :] >= lengths] = 0
    return TokenTable(ids[:, None, :], np.zeros_like(ids)[:, None, :], lengths,
                      (rows % 5000).astype(np.int32)[:, None], ("sentence",))


def _preprocess(args) -> dict:
    from data_pipelines import sharded_corpus

    source = sharded_corpus.CorpusSource(
        fields=("sentence",), max_length=args.max_length, num_rows=args.rows,
        rows=lambda index: _table(index, args.max_length), tokenizer_json=b"synthetic",
        tokenizer="synthetic", pad_id=0, description="synthetic rows")
    start = time.perf_counter()
    sharded_corpus.write_corpus(source, args.corpus, num_shards=args.num_shards)
    return {"seconds": time.perf_counter() - start}


def _read_epoch(args) -> dict:
    import numpy as np

    from data_pipelines import pipeline, sharded_corpus, shards

    after_imports = rss_now()
    start = time.perf_counter()
    kw = dict(global_batch_size=args.batch, seed=0, process_index=0,
              process_count=args.processes, pad_multiple=16)
    if args.measure == "stream":
        manifest = shards.read_manifest(args.corpus)
        steps = sharded_corpus.epoch_steps(manifest, args.batch)
        batches = pipeline.make_batches(manifest, num_steps=steps, **kw)
    else:
        table = _table(np.arange(args.rows), args.max_length)
        steps = pipeline.steps_per_epoch(table.num_examples, args.batch)
        batches = pipeline.make_batches(table, num_steps=steps, **kw)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    return {"after_imports": after_imports, "steps": steps, "tokens": tokens,
            "seconds": time.perf_counter() - start}


def _child(args, measure: str, rows: int, corpus: str) -> dict:
    cmd = [sys.executable, __file__, f"--measure={measure}", f"--rows={rows}",
           f"--corpus={corpus}", f"--max_length={args.max_length}",
           f"--num_shards={args.num_shards}", f"--batch={args.batch}",
           f"--processes={args.processes}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2,
                        help="host 0 of this many reads its num_shards/processes shards")
    parser.add_argument("--workdir", default=None, help="where the corpora go (default tmp)")
    parser.add_argument("--measure", choices=("preprocess", "stream", "in_memory"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        result = _preprocess(args) if args.measure == "preprocess" else _read_epoch(args)
        result["peak_rss"] = peak_rss()
        print(json.dumps(result))
        return

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sharded_rss."))
    summary = {"settings": {k: v for k, v in vars(args).items()
                            if k not in ("measure", "corpus", "workdir")}, "runs": []}
    for rows in (args.rows, args.rows * args.factor):
        corpus = str(workdir / f"corpus_{rows}")
        runs = {"preprocess": _child(args, "preprocess", rows, corpus)}
        for measure in ("stream", "in_memory"):
            runs[measure] = _child(args, measure, rows, corpus)
        for measure, r in runs.items():
            growth = r["peak_rss"] - r.get("after_imports", 0)
            line = (f"{rows:>9} rows  {measure:<10} peak RSS {r['peak_rss'] / 2**20:8.1f} MiB"
                    f"  ({r['seconds']:.1f} s)")
            if "after_imports" in r:
                line += f"  above the imports {growth / 2**20:8.1f} MiB over {r['steps']} steps"
            print(line, flush=True)
        summary["runs"].append({"rows": rows, **runs})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
