"""Model FLOPs utilisation on one accelerator: JAX against PyTorch, BERT-base in bfloat16.

One command, meant for a lent GPU (346 s on one H200, docs/performance.md)::

    python benchmarks/accelerator.py            # the GPU (or TPU) JAX finds
    python benchmarks/accelerator.py --smoke    # tiny shapes on CPU in seconds (CI)

Workloads (random init from transformers' ``BertConfig()``, BERT-base: 12 layers, 768 wide,
3072 FFN, 12 heads; nothing is downloaded; random token ids, no padding):

  train   one DualCSE-Cross step (``dualcse_jax``'s model, loss and ``embedding_core.
          training.make_train_step``: 5-term loss on the global batch, AdamW, dropout on,
          bf16 compute with float32 params) at the paper's batch, 64 premises x 8 fields
          (4 sentences x {explicit, implicit}) x length 128, and at a larger batch (256
          asked; without rematerialisation the activations of one premise take ~0.7 GB, so
          it is lowered to the largest multiple of 16 that fits the device, estimated from
          the batch-64 compile: 512 would need ~350 GB);
  encode  a BERT-base forward with CLS pooling, bf16, batch 512 x length 128;
  peer    the same two in PyTorch on the same device (transformers' ``BertModel``, torch
          autocast bf16 with float32 params, fused AdamW, the same 5-term loss), each
          framework in its own subprocess so each has the whole device memory;
  ceiling each framework's bf16 matmul rate, ``[n, n] @ [n, n]`` (n = 8192), and on the
          encoder's FFN shape ``[tokens, 768] @ [768, 3072]``, measured in the same run.

FLOPs are counted analytically, matmuls only, on every token (T tokens per step or call,
L the sequence length, d the width, K the weights of the encoder's dense layers: Q, K, V,
attention output, FFN in and out; embedding lookups, LayerNorm, softmax, GELU, the loss's
similarity matrices (< 0.01%) and AdamW are not counted)::

    forward (encode)  F = 2·K·T + 4·layers·L·d·T     (q·kᵀ and probs·v: 2·L·d each per token)
    train step        3·F = 6·K·T + 12·layers·L·d·T  (backward = 2 x forward)

and cross-checked against XLA's own count (``compiled.cost_analysis()["flops"]``, which also
counts elementwise ops and the optimizer, so it reads a few percent higher). MFU =
model FLOP/s / peak, the peak being the vendor's dense bf16 figure for the device (table
below, e.g. 989 TFLOP/s for H100 SXM / H200) and, next to it, the fraction of the matmul
ceiling measured here. Timing: warm-up calls, then each call synchronised
(``jax.block_until_ready`` / ``torch.cuda.synchronize``), median over the repeats.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' data sheets, matched
# in order against the device kind JAX / torch report (first match wins).
PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    ("H200 NVL", 835.0, "NVIDIA H200 NVL data sheet, 1,671 with sparsity / 2"),
    ("H200", 989.4, "NVIDIA H200 SXM data sheet, 1,979 with sparsity / 2 (same as H100 SXM)"),
    ("GH200", 989.4, "NVIDIA GH200 data sheet, 1,979 with sparsity / 2"),
    ("H100 PCIe", 756.5, "NVIDIA H100 PCIe data sheet, 1,513 with sparsity / 2"),
    ("H100 NVL", 835.0, "NVIDIA H100 NVL data sheet, 1,671 with sparsity / 2"),
    ("H100", 989.4, "NVIDIA H100 SXM data sheet, 1,979 with sparsity / 2"),
    ("B200", 2250.0, "NVIDIA B200 (HGX) data sheet, 4,500 with sparsity / 2"),
    ("A100", 312.0, "NVIDIA A100 data sheet, 624 with sparsity / 2"),
    ("L40S", 362.05, "NVIDIA L40S data sheet, 733 with sparsity / 2"),
    ("L4", 121.0, "NVIDIA L4 data sheet, 242 with sparsity / 2"),
    ("A10G", 70.0, "AWS A10G (NVIDIA A10G tensor-core bf16, dense)"),
    ("TPU v6", 918.0, "Google Cloud TPU v6e per chip"),
    ("TPU v5 lite", 197.0, "Google Cloud TPU v5e per chip"),
    ("TPU v5", 459.0, "Google Cloud TPU v5p per chip"),
    ("TPU v4", 275.0, "Google Cloud TPU v4 per chip"),
)

FIELDS_PER_EXAMPLE = 8  # DualCSE-Cross: 4 sentences x {explicit, implicit} indicator


def peak_tflops(device_kind: str) -> tuple[float | None, str]:
    """The vendor's dense bf16 peak for a device kind, ``(None, reason)`` when unknown."""
    for key, value, source in PEAK_BF16_TFLOPS:
        if key.lower() in device_kind.lower():
            return value, source
    return None, f"no table entry for {device_kind!r}: MFU is given against the measured ceiling"


def model_shape(smoke: bool) -> dict:
    """BERT-base (transformers' ``BertConfig()`` defaults) or, for ``--smoke``, a tiny one."""
    from transformers import BertConfig

    if smoke:
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=1,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=64)
    else:
        cfg = BertConfig()
    return cfg.to_dict()


def analytic_flops(shape: dict, tokens: int, length: int, *, train: bool) -> float:
    """Matmul FLOPs of a BERT forward (``train``: x3 for the backward) over ``tokens`` tokens
    of sequences of ``length``; the formula is in the module docstring."""
    d, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kernels = layers * (4 * d * d + 2 * d * f)
    forward = 2 * kernels * tokens + 4 * layers * length * d * tokens
    return float(3 * forward if train else forward)


def random_cross_batch(batch: int, length: int, vocab: int, seed: int = 0) -> dict:
    """A DualCSE-Cross global batch of random ids: ``[batch, 8, length]`` int32 inputs, all
    positions real, and ``text_ids [batch, 8]`` (one identity per sentence, both indicator
    fields of a sentence share it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (batch, FIELDS_PER_EXAMPLE, length)
    ids = rng.integers(1000 if vocab > 2000 else 1, vocab, size=shape, dtype=np.int32)
    text_ids = (np.arange(batch)[:, None] * 4 + np.arange(FIELDS_PER_EXAMPLE)[None, :] // 2)
    return {"input_ids": ids, "attention_mask": np.ones(shape, np.int32),
            "token_type_ids": np.zeros(shape, np.int32), "text_ids": text_ids.astype(np.int32)}


def _median_times(call, sync, *, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        sync(call())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sync(call())
        times.append(time.perf_counter() - t)
    return times


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- JAX side


def dualcse_cross_setup(shape: dict, batch: int, length: int, *, dropout_impl: str = "flax",
                        dtype: str = "bfloat16", devices=None):
    """The BERT-shaped DualCSE-Cross train step of ``dualcse_jax`` on a one-device mesh.

    Returns ``(step, state, batch, rng, mesh)``: ``step`` from ``embedding_core.training.training.
    make_train_step`` (``step.jitted`` lowers ahead of time), a fresh random state, a
    random global batch (``[batch, 8, length]``) on the mesh. ``benchmarks/memory_report.py``
    lowers the same step on abstract inputs.
    """
    import jax

    from dualcse_jax.configs import default
    from dualcse_jax.data import model_inputs
    from dualcse_jax.loss import dualcse_loss
    from dualcse_jax.model import build_model, init_fn, sentence_text_ids
    from embedding_core.distributed import parallel
    from embedding_core.models.encoders import EncoderConfig
    from embedding_core.training import run, training

    config = default.get_config()
    config.architecture, config.pooling, config.dtype = "cross", "cls", dtype
    config.dropout, config.dropout_impl, config.batch_size = True, dropout_impl, batch
    model = build_model(config, EncoderConfig.from_hf_config(shape))
    mesh = parallel.make_mesh(1, 1, devices=(devices or jax.devices())[:1])
    tx, schedule = run.default_optimizer(config, 1000)
    init_rng, rng = jax.random.split(jax.random.key(0))
    state, shardings = training.create_sharded_state(init_fn(model), tx, mesh, init_rng)

    def loss_fn(params, batch, rng):
        # dualcse_jax.trainer.make_loss_fn, rebuilt here: importing the trainer imports the
        # input pipeline and TensorFlow (seconds of start-up for nothing used).
        r, u = model.apply({"params": params}, *model_inputs(batch), deterministic=False,
                           rngs={"dropout": rng})
        return dualcse_loss(r, u, sentence_text_ids(batch["text_ids"], "cross"),
                            temperature=config.temperature)

    step = training.make_train_step(loss_fn, shardings, mesh, schedule=schedule)
    host = random_cross_batch(batch, length, shape["vocab_size"])
    return step, state, parallel.host_to_global(host, mesh), rng, mesh


def _xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def _jax_memory(compiled) -> dict:
    try:
        m = compiled.memory_analysis()
        return {"temp_bytes": int(m.temp_size_in_bytes),
                "arg_bytes": int(m.argument_size_in_bytes)}
    except Exception:  # noqa: BLE001
        return {}


def jax_matmul_tflops(n: int, m: int | None, k: int | None, *, dtype: str, inner: int,
                      repeats: int) -> float:
    """``[n, k] @ [k, m]`` TFLOP/s in XLA (bf16: float32 accumulation), median of ``repeats``
    timings of ``inner`` products dispatched back to back."""
    import jax

    m, k = m or n, k or n
    kx, ky = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (n, k), dtype)
    y = jax.random.normal(ky, (k, m), dtype)

    product = jax.jit(lambda x, y: x @ y)

    def chain():
        # `inner` products dispatched back to back, one wait at the end: launch latency
        # overlaps the previous product instead of being timed.
        return [product(x, y) for _ in range(inner)]

    times = _median_times(chain, jax.block_until_ready, warmup=2,
                          repeats=repeats)
    return 2.0 * n * m * k * inner / statistics.median(times) / 1e12


def jax_worker(args) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from dualcse_jax.model import DualEncoder, build_model, init_fn
    from embedding_core.distributed import parallel
    from embedding_core.models.encoders import EncoderConfig

    dev = jax.devices()[0]
    out: dict = {"framework": "jax", "version": jax.__version__, "device": dev.device_kind,
                 "platform": dev.platform, "dropout_impl": args.dropout_impl}
    if dev.platform == "cpu" and not args.smoke:
        # BERT-base at these shapes would take hours on a CPU.
        out["error"] = ("JAX sees no accelerator (a CPU-only jaxlib? on a GPU install "
                        "jax[cuda12]); --smoke runs the tiny shapes on CPU")
        return out
    shape = model_shape(args.smoke)
    d = shape["hidden_size"]
    _log(f"[jax] {dev.platform} {dev.device_kind}, jax {jax.__version__}")
    out["ceiling_tflops"] = jax_matmul_tflops(args.matmul_n, None, None, dtype=args.dtype,
                                              inner=args.inner, repeats=args.repeats)
    ffn_tokens = args.train_batches[0] * FIELDS_PER_EXAMPLE * args.length
    out["ceiling_ffn_tflops"] = jax_matmul_tflops(
        ffn_tokens, shape["intermediate_size"], d, dtype=args.dtype, inner=args.inner,
        repeats=args.repeats)
    _log(f"[jax] {args.dtype} matmul ceiling {out['ceiling_tflops']:.1f} TFLOP/s "
         f"({args.matmul_n}^3), FFN shape {out['ceiling_ffn_tflops']:.1f}")

    out["train"] = {}
    limit = (dev.memory_stats() or {}).get("bytes_limit")
    fitted = None  # (batch, temp bytes, argument bytes) of the last compiled step
    for requested in args.train_batches:
        batch = requested
        if fitted and limit:
            # Temporaries grow with the batch, arguments (the state) do not: the largest
            # multiple of 16 premises that fits 92% of the device, estimated from the last
            # compile, so that no compile is spent on a batch that cannot run.
            per_premise = fitted[1] / fitted[0]
            batch = min(requested, int((0.92 * limit - fitted[2]) / per_premise) // 16 * 16)
        key = str(batch)
        try:
            out["train"][key] = _jax_train(args, shape, batch)
            if batch != requested:
                out["train"][key]["requested_batch"] = requested
            fitted = (batch, out["train"][key].get("temp_bytes", 0),
                      out["train"][key].get("arg_bytes", 0))
        except Exception as err:  # noqa: BLE001 - e.g. out of memory at the larger batch
            out["train"][key] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            _log(f"[jax] train batch {batch}: {out['train'][key]['error']}")
        jax.clear_caches()

    # Encode: the same encoder forward Embedder.encode runs, on one fixed shape.
    config = _encode_config(args.dtype)
    model = build_model(config, EncoderConfig.from_hf_config(shape))
    mesh = parallel.make_mesh(1, 1, devices=[dev])
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        params = nn.unbox(jax.jit(init_fn(model))(jax.random.key(0)))
    n, length = args.encode_batch, args.length
    host = random_cross_batch(n, length, shape["vocab_size"])
    ids, mask, types = (jnp.asarray(host[k][:, 0]) for k in
                        ("input_ids", "attention_mask", "token_type_ids"))

    def forward(p, ids, mask, types):
        return model.apply({"params": p}, ids, mask, types, "explicit",
                           method=DualEncoder.encode_single)

    t = time.perf_counter()
    compiled = jax.jit(forward).lower(params, ids, mask, types).compile()
    compile_s = time.perf_counter() - t
    times = _median_times(lambda: compiled(params, ids, mask, types), jax.block_until_ready,
                          warmup=args.warmup, repeats=args.repeats * args.steps)
    out["encode"] = _figures(analytic_flops(shape, n * length, length, train=False), times,
                             _xla_flops(compiled), items=n, compile_s=compile_s)
    out["encode"]["batch"], out["encode"]["length"] = n, length
    _log(f"[jax] encode {n}x{length}: {out['encode']['items_per_s']:.0f} sentences/s, "
         f"{out['encode']['tflops']:.1f} TFLOP/s")
    return out


def _encode_config(dtype: str):
    from dualcse_jax.configs import default

    config = default.get_config()
    config.architecture, config.pooling, config.dtype = "cross", "cls", dtype
    return config


def _jax_train(args, shape: dict, batch: int) -> dict:
    import flax.linen as nn
    import jax

    from embedding_core.distributed import parallel

    step, state, gbatch, rng, mesh = dualcse_cross_setup(
        shape, batch, args.length, dropout_impl=args.dropout_impl, dtype=args.dtype)
    t = time.perf_counter()
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        compiled = step.jitted.lower(state, gbatch, rng).compile()
    compile_s = time.perf_counter() - t
    memory = _jax_memory(compiled)
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    need = memory.get("temp_bytes", 0) + memory.get("arg_bytes", 0)
    if limit and need > limit:
        raise MemoryError(f"needs {need / 2**30:.1f} GiB, the device has {limit / 2**30:.1f}")
    holder = {"state": state}

    def call():
        holder["state"], metrics = compiled(holder["state"], gbatch, rng)
        return holder["state"], metrics

    times = _median_times(call, jax.block_until_ready, warmup=args.warmup,
                          repeats=args.repeats * args.steps)
    tokens = batch * FIELDS_PER_EXAMPLE * args.length
    result = _figures(analytic_flops(shape, tokens, args.length, train=True), times,
                      _xla_flops(compiled), items=batch, compile_s=compile_s)
    result.update(memory, batch=batch, length=args.length, tokens=tokens)
    _log(f"[jax] train batch {batch}: {result['step_s'] * 1e3:.1f} ms/step, "
         f"{result['tflops']:.1f} TFLOP/s, compile {compile_s:.1f} s")
    return result


def _figures(flops: float, times: list[float], xla_flops: float | None, *, items: int,
             compile_s: float | None = None) -> dict:
    t = statistics.median(times)
    out = {"flops": flops, "step_s": t, "tflops": flops / t / 1e12, "items_per_s": items / t,
           "repeats": len(times), "spread": (max(times) - min(times)) / t}
    if xla_flops is not None:
        out["xla_flops"] = xla_flops
        out["xla_over_analytic"] = xla_flops / flops
    if compile_s is not None:
        out["compile_s"] = compile_s
    return out


# --------------------------------------------------------------------------- torch side


def torch_dualcse_loss(r, u, text_ids, temperature: float = 0.05):
    """``dualcse_jax.loss.dualcse_loss`` (all five terms) in torch: ``r, u [B, 4, d]``,
    ``text_ids [B, 4]``; duplicates of a positive are left out of its denominator."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    r, u = r.float(), u.float()
    rid, uid = text_ids * 2, text_ids * 2 + 1
    n = r.shape[0]
    pos = torch.arange(n, device=r.device)

    def term(q, blocks):
        keys = torch.cat([b[0] for b in blocks])
        ids = torch.cat([b[1] for b in blocks])
        logits = F.normalize(q, dim=-1) @ F.normalize(keys, dim=-1).T / temperature
        dup = (ids[None, :] == ids[pos][:, None]) & (
            torch.arange(len(ids), device=r.device)[None, :] != pos[:, None])
        return F.cross_entropy(logits.masked_fill(dup, float("-inf")), pos)

    terms = [term(r[:, 0], [(r[:, 1], rid[:, 1]), (r[:, 3], rid[:, 3]), (u[:, 0], uid[:, 0])]),
             term(u[:, 0], [(r[:, 2], rid[:, 2]), (r[:, 3], rid[:, 3]), (r[:, 0], rid[:, 0])])]
    terms += [term(r[:, k], [(u[:, k], uid[:, k])]) for k in (1, 2, 3)]
    return sum(terms)


def torch_matmul_tflops(torch, device, n, m, k, *, dtype, inner, repeats, sync) -> float:
    """:func:`jax_matmul_tflops` in torch."""
    m, k = m or n, k or n
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(n, k, device=device, dtype=getattr(torch, dtype), generator=g)
    y = torch.randn(k, m, device=device, dtype=getattr(torch, dtype), generator=g)

    def chain():
        return [x @ y for _ in range(inner)]

    times = _median_times(chain, sync, warmup=2, repeats=repeats)
    return 2.0 * n * m * k * inner / statistics.median(times) / 1e12


def torch_worker(args) -> dict:
    import torch
    from transformers import BertConfig, BertModel

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    kind = torch.cuda.get_device_name() if device == "cuda" else "cpu"

    def sync(_=None):
        if device == "cuda":
            torch.cuda.synchronize()

    shape = model_shape(args.smoke)
    d = shape["hidden_size"]
    out: dict = {"framework": "torch", "version": torch.__version__, "device": kind}
    if device == "cpu" and not args.smoke:
        out["error"] = ("torch sees no CUDA device (a CPU build of torch? install a CUDA "
                        "build to run the peer)")
        return out
    _log(f"[torch] {device} {kind}, torch {torch.__version__}")
    out["ceiling_tflops"] = torch_matmul_tflops(torch, device, args.matmul_n, None, None,
                                                dtype=args.dtype, inner=args.inner,
                                                repeats=args.repeats, sync=sync)
    ffn_tokens = args.train_batches[0] * FIELDS_PER_EXAMPLE * args.length
    out["ceiling_ffn_tflops"] = torch_matmul_tflops(
        torch, device, ffn_tokens, shape["intermediate_size"], d, dtype=args.dtype,
        inner=args.inner, repeats=args.repeats, sync=sync)
    _log(f"[torch] {args.dtype} matmul ceiling {out['ceiling_tflops']:.1f} TFLOP/s, FFN shape "
         f"{out['ceiling_ffn_tflops']:.1f}")
    torch.manual_seed(0)
    model = BertModel(BertConfig(**shape), add_pooling_layer=False).to(device)
    out["attn_implementation"] = str(getattr(model.config, "_attn_implementation", "?"))
    autocast = lambda: torch.autocast(  # noqa: E731
        device_type=device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

    out["train"] = {}
    for batch in args.train_batches:
        try:
            out["train"][str(batch)] = _torch_train(torch, model, args, shape, batch, device,
                                                    autocast, sync)
        except Exception as err:  # noqa: BLE001 - e.g. out of memory at the larger batch
            out["train"][str(batch)] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            _log(f"[torch] train batch {batch}: {out['train'][str(batch)]['error']}")
        if device == "cuda":
            torch.cuda.empty_cache()

    model.eval()
    n, length = args.encode_batch, args.length
    host = random_cross_batch(n, length, shape["vocab_size"])
    ids, mask, types = (torch.from_numpy(host[k][:, 0]).long().to(device)
                        for k in ("input_ids", "attention_mask", "token_type_ids"))

    def encode():
        with torch.inference_mode(), autocast():
            return model(input_ids=ids, attention_mask=mask,
                         token_type_ids=types).last_hidden_state[:, 0].float()

    times = _median_times(encode, sync, warmup=args.warmup, repeats=args.repeats * args.steps)
    out["encode"] = _figures(analytic_flops(shape, n * length, length, train=False), times,
                             None, items=n)
    out["encode"]["batch"], out["encode"]["length"] = n, length
    _log(f"[torch] encode {n}x{length}: {out['encode']['items_per_s']:.0f} sentences/s, "
         f"{out['encode']['tflops']:.1f} TFLOP/s")
    return out


def _torch_train(torch, model, args, shape, batch, device, autocast, sync) -> dict:
    model.train()
    host = random_cross_batch(batch, args.length, shape["vocab_size"])
    ids, mask, types = (torch.from_numpy(host[k]).long().to(device).view(-1, args.length)
                        for k in ("input_ids", "attention_mask", "token_type_ids"))
    text_ids = torch.from_numpy(host["text_ids"][:, 0::2]).long().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0,
                            fused=device == "cuda")
    d = shape["hidden_size"]

    def step():
        with autocast():
            cls = model(input_ids=ids, attention_mask=mask,
                        token_type_ids=types).last_hidden_state[:, 0]
        e = cls.float().view(batch, FIELDS_PER_EXAMPLE, d)
        loss = torch_dualcse_loss(e[:, 0::2], e[:, 1::2], text_ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    times = _median_times(step, sync, warmup=args.warmup, repeats=args.repeats * args.steps)
    tokens = batch * FIELDS_PER_EXAMPLE * args.length
    result = _figures(analytic_flops(shape, tokens, args.length, train=True), times, None,
                      items=batch)
    result.update(batch=batch, length=args.length, tokens=tokens)
    if device == "cuda":
        result["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    _log(f"[torch] train batch {batch}: {result['step_s'] * 1e3:.1f} ms/step, "
         f"{result['tflops']:.1f} TFLOP/s")
    return result


# --------------------------------------------------------------------------- driver


def _without_option(argv: list[str], name: str) -> list[str]:
    """argv less ``name VALUE`` / ``name=VALUE`` (the workers get the rest)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def _run_worker(name: str, argv: list[str], smoke: bool, timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        # JAX takes 75% of the device by default; each framework runs alone in its process.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, *argv]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"error": f"worker exited {proc.returncode}; see its output above"}
    return json.loads(lines[-1])


def summarise(jax_r: dict, torch_r: dict | None, peak: float | None) -> dict:
    """Ratios and fractions of peak / ceiling for each workload present in both results."""
    rows = {}
    workloads = [(f"train_b{b}", jax_r.get("train", {}).get(b),
                  (torch_r or {}).get("train", {}).get(b)) for b in jax_r.get("train", {})]
    workloads.append(("encode", jax_r.get("encode"), (torch_r or {}).get("encode")))
    for name, j, t in workloads:
        row = {}
        for tag, r, ceiling in (("jax", j, jax_r.get("ceiling_tflops")),
                                ("torch", t, (torch_r or {}).get("ceiling_tflops"))):
            if not r or "tflops" not in r:
                continue
            row[f"{tag}_tflops"] = r["tflops"]
            row[f"{tag}_items_per_s"] = r["items_per_s"]
            if peak:
                row[f"{tag}_mfu"] = r["tflops"] / peak
            if ceiling:
                row[f"{tag}_of_ceiling"] = r["tflops"] / ceiling
        if "jax_tflops" in row and "torch_tflops" in row:
            row["jax_over_torch"] = row["jax_tflops"] / row["torch_tflops"]
        rows[name] = row
    return rows


def _print_table(rows: dict, peak: float | None) -> None:
    def pct(x):
        return f"{100 * x:5.1f}%" if x is not None else "    - "

    print(f"{'workload':12s} {'JAX TFLOP/s':>11s} {'MFU':>6s} {'of ceil':>7s}   "
          f"{'torch TFLOP/s':>13s} {'MFU':>6s} {'of ceil':>7s}   {'JAX/torch':>9s}")
    for name, r in rows.items():
        ratio = r.get("jax_over_torch")
        print(f"{name:12s} {r.get('jax_tflops', float('nan')):11.1f} {pct(r.get('jax_mfu'))} "
              f"{pct(r.get('jax_of_ceiling')):>7s}   {r.get('torch_tflops', float('nan')):13.1f} "
              f"{pct(r.get('torch_mfu'))} {pct(r.get('torch_of_ceiling')):>7s}   "
              f"{f'{ratio:.2f}x' if ratio else '-':>9s}")
    against = f"{peak:.1f} TFLOP/s (table)" if peak else "no table peak"
    print(f"MFU against {against}; 'of ceil' against the matmul ceiling each framework "
          "measured in this run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU, a few seconds (CI keeps the script working)")
    parser.add_argument("--train-batches", default=None,
                        help="comma-separated DualCSE-Cross global batches (default 64,256; a "
                             "batch past the device memory is lowered to the largest that "
                             "fits, estimated from the previous batch's compile)")
    parser.add_argument("--length", type=int, default=None, help="sequence length (128)")
    parser.add_argument("--encode-batch", type=int, default=None, help="encode batch (512)")
    parser.add_argument("--steps", type=int, default=None, help="timed calls per repeat")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--matmul-n", type=int, default=None, help="ceiling matmul size (8192)")
    parser.add_argument("--inner", type=int, default=None, help="products per ceiling timing")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                        help="compute dtype (bfloat16; --smoke: float32, which compiles "
                             "twice as fast on CPU)")
    parser.add_argument("--dropout-impl", default="flax", choices=("flax", "hash"),
                        help="JAX dropout masks: flax (the default config) or hash")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--save", default=None,
                        help="folder: each framework's result is written there as it finishes "
                             "(jax.json, torch.json, report.json), so a run cut short keeps "
                             "what it measured")
    parser.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (dict(train_batches="4", length=16, encode_batch=8, steps=2, repeats=2,
                     warmup=1, matmul_n=128, inner=2, dtype="float32") if args.smoke else
                dict(train_batches="64,256", length=128, encode_batch=512, steps=4, repeats=5,
                     warmup=3, matmul_n=8192, inner=10, dtype="bfloat16"))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.train_batches = [int(b) for b in str(args.train_batches).split(",")]

    if args.worker:
        result = jax_worker(args) if args.worker == "jax" else torch_worker(args)
        print(json.dumps(result))
        return 0

    started = time.perf_counter()
    forward = [a for a in (argv if argv is not None else sys.argv[1:])]
    if args.save:
        forward = _without_option(forward, "--save")
        Path(args.save).mkdir(parents=True, exist_ok=True)

    def save(name: str, result: dict | None) -> None:
        if args.save and result is not None:
            (Path(args.save) / f"{name}.json").write_text(json.dumps(result, indent=1))

    timeout = 120.0 if args.smoke else 420.0
    jax_r = _run_worker("jax", forward, args.smoke, timeout)
    save("jax", jax_r)
    torch_r = None
    if not args.skip_torch:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            torch_r = {"error": "torch is not installed (pip install torch)"}
        else:
            # The torch peer runs the batches the JAX side could run (memory caps them).
            ran = [b for b, r in jax_r.get("train", {}).items() if "error" not in r]
            peer_args = forward + (["--train-batches", ",".join(ran)] if ran else [])
            torch_r = _run_worker("torch", peer_args, args.smoke, timeout)
            save("torch", torch_r)
    kind = jax_r.get("device", "?")
    peak, peak_source = peak_tflops(kind) if jax_r.get("platform") not in (None, "cpu") else (
        None, "CPU: no table peak, fractions are of the measured ceiling")
    rows = summarise(jax_r, torch_r, peak) if "error" not in jax_r else {}
    print(f"device: {kind}; peak: {peak_source}")
    if rows:
        _print_table(rows, peak)
    for tag, r in (("jax", jax_r), ("torch", torch_r)):
        if r and "error" in r:
            print(f"{tag}: {r['error']}")
    report = {"smoke": args.smoke, "device": kind, "peak_tflops": peak, "peak_source": peak_source,
              "wall_s": time.perf_counter() - started, "summary": rows, "jax": jax_r,
              "torch": torch_r}
    save("report", report)
    print(json.dumps(report))
    return 1 if "error" in jax_r else 0


if __name__ == "__main__":
    sys.exit(main())
