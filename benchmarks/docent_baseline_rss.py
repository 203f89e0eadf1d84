"""Host memory of DocEnt's Bag-of-Sentences baseline as the sentences grow: blocks with a
per-entity running sum against the matrix of every sentence.

``--sentences`` synthetic sentences (sentence ``i``: six words of GloVe's vocabulary chosen
by ``i``, entity ``i % --entities``; made on demand, never held as a list) and
``--small`` of them are each turned into entity vectors, each in a fresh Python process:

* ``blocked``: ``docent_jax.baselines.encode_bag_of_sentences`` (``--block`` sentences per
  encoder call into a float64 ``[entities, 50]`` sum), what ``evaluate_baselines`` runs;
* ``whole`` (the former form): every sentence's vector, then ``bag_of_sentences``.

The encoder is BoS-GloVe's (``GloveAverageEncoder``, 50d). Each process reports its peak
RSS (``resource.getrusage``) and its RSS after loading GloVe, so the growth is what the
sentences cost; the two forms' entity vectors are compared. Prints one line per run, the
growth from ``--small`` to ``--sentences`` against one block's bytes, and a JSON summary::

    python benchmarks/docent_baseline_rss.py --sentences=2000000 --small=20000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rss import ROOT, peak_rss, rss_now  # noqa: E402,F401 (sets the environment)


class Sentences(Sequence):
    """Sentence ``i``: six words of ``words`` picked by ``i``; slices are lists."""

    def __init__(self, n: int, words: list[str]):
        self.n, self.words = n, words

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        w = self.words
        return " ".join(w[(i * p + k * 7919) % len(w)] for k, p in
                        enumerate((1, 3, 7, 11, 13, 17)))


def _run(args) -> dict:
    import numpy as np

    from docent_jax import baselines

    encoder = baselines.GloveAverageEncoder()
    words = list(encoder.index)[1000:21000]  # common words, all in the vocabulary
    after_load = rss_now()
    texts = Sentences(args.sentences, words)
    entity_of = (np.arange(args.sentences) % args.entities).astype(np.int32)
    start = time.perf_counter()
    if args.measure == "blocked":
        vectors = baselines.encode_bag_of_sentences(encoder, texts, entity_of, args.entities,
                                                    block_size=args.block)
    else:
        vectors = baselines.bag_of_sentences(encoder.encode(texts[:]), entity_of,
                                             args.entities)
    np.save(args.out, vectors)
    return {"after_load": after_load, "seconds": time.perf_counter() - start,
            "peak_rss": peak_rss()}


def _child(args, measure: str, sentences: int, out: Path) -> dict:
    cmd = [sys.executable, __file__, f"--measure={measure}", f"--sentences={sentences}",
           f"--entities={args.entities}", f"--block={args.block}", f"--out={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{measure} {sentences} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=2_000_000)
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--block", type=int, default=8192, help="sentences per encoder call")
    parser.add_argument("--skip_whole_large", action="store_true",
                        help="no `whole` run at --sentences (it holds every vector)")
    parser.add_argument("--measure", choices=("blocked", "whole"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(_run(args)))
        return
    import numpy as np

    workdir = Path(tempfile.mkdtemp(prefix="docent_baseline_rss."))
    runs: dict = {}
    for sentences in (args.small, args.sentences):
        for measure in ("blocked", "whole"):
            if measure == "whole" and sentences == args.sentences and args.skip_whole_large:
                continue
            r = _child(args, measure, sentences, workdir / f"{measure}_{sentences}.npy")
            runs[f"{measure} {sentences}"] = r
            print(f"{sentences:>9} sentences  {measure:<8} peak RSS {r['peak_rss'] / 2**20:8.1f}"
                  f" MiB  above GloVe {(r['peak_rss'] - r['after_load']) / 2**20:8.1f} MiB  "
                  f"({r['seconds']:.1f} s)", flush=True)
        if f"whole {sentences}" in runs:
            a = np.load(workdir / f"blocked_{sentences}.npy")
            b = np.load(workdir / f"whole_{sentences}.npy")
            runs[f"equal {sentences}"] = bool(np.array_equal(a, b))
            print(f"{sentences:>9} sentences  blocked == whole: {runs[f'equal {sentences}']}")
    block_bytes = args.block * 50 * 4
    growth = {m: runs[f"{m} {args.sentences}"]["peak_rss"] - runs[f"{m} {args.small}"]["peak_rss"]
              for m in ("blocked", "whole") if f"{m} {args.sentences}" in runs}
    for m, g in growth.items():
        print(f"{m}: peak RSS {args.small} -> {args.sentences} sentences grew "
              f"{g / 2**20:+.1f} MiB = {g / block_bytes:+.2f} blocks of {args.block} x 50 "
              "float32")
    print(json.dumps({"settings": {k: v for k, v in vars(args).items()
                                   if k not in ("measure", "out")},
                      "block_bytes": block_bytes, "runs": runs, "growth": growth}))


if __name__ == "__main__":
    main()
