"""Per-device memory of the steps that outgrow one device: compile-only, fake CPU devices
(64, of which each case's mesh takes the first ones).

Every case compiles one train step on abstract inputs (``ShapeDtypeStruct``s with their
shardings; nothing is allocated) and reads XLA's ``memory_analysis()`` of the per-device
program: temporaries and arguments (the sharded train state and batch). Cases:

  docent_10M_2x4_tiled / _untiled, docent_10M_1x8_tiled
      DocEnt-Dual's full softmax over 10,000,000 x 256 entities, batch 1024, on a 2x4 and
      a 1x8 (data x model) mesh, tiled in blocks of 8,192 entities
      (``config.vocab_block_size``) or untiled (``benchmarks/memory_cases.py``,
      ``docent_full_softmax_case``); and ``..._tiled_fused``, the tiled step with
      ``config.fused_table_update`` (the table's optimizer step block by block, so the
      full table gradient, 2.56 GB per device on 2x4, is never built): the tiled softmax
      alone does not reach 1 GB of temporaries on 2x4, tiled + fused does;
  dualcse_{32768,65536}_{chunked,unchunked}
      a DualCSE-Cross step with a tiny encoder (2 layers x 32) at global batch 32,768 and
      65,536 on 8 data devices, with ``config.contrastive_chunk_size`` = 256 rows per device
      (GradCache) or without (``dualcse_cross_case``);
  bert_base_dualcse_bf16
      a BERT-base (transformers' ``BertConfig()``: 12 x 768, random init) DualCSE-Cross step
      at the paper's batch, 64 premises x 8 fields x 128 tokens, bfloat16 compute with
      float32 parameters and AdamW moments, dropout on, on one device;
  dualcse_bert_base_v4 / _v5e
      the ``dualcse_jax/configs/cross_tpu.py`` preset as it is (global batch 512, 8 fields
      x 128 tokens, bfloat16, its GradCache chunk and ``remat``) on BERT-base over 16 and
      64 data devices: a v4 chip has 32 GiB, a v5e chip 16 GiB, and the targets are 28 and
      14 GiB of temporaries + arguments; ``..._remat_none``: the same with ``remat=none``.

  python benchmarks/memory_report.py            # the full cases, a few minutes
  python benchmarks/memory_report.py --smoke    # small sizes, seconds

Prints one line per case, then, as the last line, one JSON object
``{case: {"temp_bytes": int, "arg_bytes": int} | null}``; a case that cannot be compiled
(e.g. its compilation runs out of host memory) is ``null`` and its reason is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=64")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memory_cases  # noqa: E402  (after the device count is set, before JAX starts)

CASES = ("docent_10M_2x4_tiled", "docent_10M_2x4_untiled", "docent_10M_1x8_tiled",
         "dualcse_32768_chunked", "dualcse_32768_unchunked", "dualcse_65536_chunked",
         "dualcse_65536_unchunked", "bert_base_dualcse_bf16", "dualcse_bert_base_v4",
         "dualcse_bert_base_v5e")
# Beyond the issues' cases: the tiled step with the fused table update
# (config.fused_table_update), whose table gradient is never built whole; the pod preset
# without rematerialisation.
EXTRA = ("docent_10M_2x4_tiled_fused", "docent_10M_1x8_tiled_fused",
         "dualcse_bert_base_v4_remat_none", "dualcse_bert_base_v5e_remat_none")
POD_LIMITS = {"dualcse_bert_base_v4": 28, "dualcse_bert_base_v5e": 14}
"""GiB per device (temporaries + arguments) the pod preset must fit: v4 32 GiB, v5e 16."""


def _targets(out: dict) -> list[str]:
    """The issue's two memory targets, checked on this run's figures."""
    def temp(name):
        return (out.get(name) or {}).get("temp_bytes")

    lines = []
    for case in ("docent_10M_2x4_tiled", "docent_10M_2x4_tiled_fused"):
        if temp(case) is not None:
            ok = "meets" if temp(case) <= 1e9 else "misses"
            lines.append(f"target: {case} temporaries {temp(case) / 1e9:.3f} GB per device "
                         f"{ok} <= 1.0 GB")
    for case, limit in POD_LIMITS.items():
        if out.get(case):
            gib = (out[case]["temp_bytes"] + out[case]["arg_bytes"]) / 2**30
            lines.append(f"target: {case} temporaries + arguments {gib:.2f} GiB per device "
                         f"{'meets' if gib <= limit else 'misses'} <= {limit} GiB")
    a, b = temp("dualcse_32768_chunked"), temp("dualcse_65536_chunked")
    if a and b:
        lines.append(f"target: dualcse chunked temporaries 65,536 / 32,768 = {b / a:.2f}x "
                     f"({'meets' if b <= 2 * a else 'misses'} <= 2x)")
    return lines


def bert_base_dualcse_case(batch: int = 64, seq_len: int = 128, *, dtype: str = "bfloat16",
                           shape: dict | None = None) -> dict[str, int]:
    """Per-device bytes of one BERT-base DualCSE-Cross train step on one device.

    The step is the real one (``dualcse_jax.trainer.make_loss_fn``: 5-term loss, CLS
    pooling, dropout on; ``embedding_core.training.training.make_train_step`` with AdamW and donated
    state) on abstract inputs: ``batch`` premises x 8 token fields x ``seq_len``.

    Args:
      batch: premises per step (the paper: 64). seq_len: tokens per field (the paper's
        max_length: 128). dtype: encoder compute dtype (parameters stay float32).
      shape: a transformers ``BertConfig`` dict; default ``BertConfig()`` (BERT-base).

    Returns:
      ``{"temp_bytes": int, "arg_bytes": int}``.
    """
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from transformers import BertConfig

    from dualcse_jax.configs import default
    from dualcse_jax.model import build_model, init_fn
    from dualcse_jax.trainer import make_loss_fn
    from embedding_core import configs
    from embedding_core.distributed import parallel
    from embedding_core.models.encoders import EncoderConfig
    from embedding_core.training import training

    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])
    c = default.get_config()
    c.architecture, c.pooling, c.dtype, c.batch_size = "cross", "cls", dtype, batch
    model = build_model(c, EncoderConfig.from_hf_config(shape or BertConfig().to_dict()))
    init = init_fn(model)
    tx, schedule = training.make_optimizer(learning_rate=5e-5, total_steps=1000)
    rules = configs.axis_rules(c)
    shardings = training.state_shardings(init, tx, mesh, rules)

    def init_state(rng):
        params = nn.unbox(init(rng))
        return training.TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None,
                                   params=params, tx=tx, opt_state=tx.init(params),
                                   first_nonfinite_step=jnp.full((), -1, jnp.int32))

    abstract = jax.eval_shape(init_state, jax.random.key(0))
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    step = training.make_train_step(make_loss_fn(model, c), shardings, mesh,
                                    schedule=schedule, rules=rules)
    rows = NamedSharding(mesh, P("data"))
    tokens = jax.ShapeDtypeStruct((batch, 8, seq_len), jnp.int32, sharding=rows)
    batch_in = {"input_ids": tokens, "attention_mask": tokens, "token_type_ids": tokens,
                "text_ids": jax.ShapeDtypeStruct((batch, 8), jnp.int32, sharding=rows)}
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P()))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        compiled = step.jitted.lower(state, batch_in, key).compile()
    return memory_cases.compiled_bytes(compiled)


def pod_preset_case(mesh_data: int, *, remat: str | None = None, smoke: bool = False
                    ) -> dict[str, int]:
    """Per-device bytes of one ``cross_tpu.py`` step on BERT-base (``smoke``: a
    1-layer, 64-wide BERT at 16 tokens) over ``mesh_data`` devices; ``remat`` overrides the
    preset's (``memory_cases.dualcse_step_case``)."""
    from transformers import BertConfig

    from dualcse_jax.configs import cross_tpu
    from embedding_core.models.encoders import EncoderConfig

    c = cross_tpu.get_config()
    if remat is not None:
        c.remat = remat
    shape = BertConfig().to_dict()  # BERT-base: 12 x 768, 30,522 word pieces
    if smoke:
        shape.update(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                     intermediate_size=128)
    return memory_cases.dualcse_step_case(c, EncoderConfig.from_hf_config(shape),
                                          16 if smoke else int(c.max_length), mesh_data)


def case_builders(smoke: bool) -> dict:
    """``{case: zero-argument function}`` for every case (small sizes with ``smoke``)."""
    entities, dim, qbatch, block = ((100_000, 32, 64, 1024) if smoke else
                                    (10_000_000, 256, 1024, 8192))
    small, large, chunk = (256, 512, 16) if smoke else (32768, 65536, 256)
    tiny_bert = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 64,
                 "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128,
                 "max_position_embeddings": 128}
    docent = memory_cases.docent_full_softmax_case
    dualcse = memory_cases.dualcse_cross_case
    return {
        "docent_10M_2x4_tiled": lambda: docent(entities, dim, qbatch, 2, 4, block),
        "docent_10M_2x4_untiled": lambda: docent(entities, dim, qbatch, 2, 4, 0),
        "docent_10M_1x8_tiled": lambda: docent(entities, dim, qbatch, 1, 8, block),
        "docent_10M_2x4_tiled_fused": lambda: docent(entities, dim, qbatch, 2, 4, block,
                                                     fused=True),
        "docent_10M_1x8_tiled_fused": lambda: docent(entities, dim, qbatch, 1, 8, block,
                                                     fused=True),
        "dualcse_32768_chunked": lambda: dualcse(small, chunk),
        "dualcse_32768_unchunked": lambda: dualcse(small, 0),
        "dualcse_65536_chunked": lambda: dualcse(large, chunk),
        "dualcse_65536_unchunked": lambda: dualcse(large, 0),
        "bert_base_dualcse_bf16": (
            (lambda: bert_base_dualcse_case(8, 16, shape=tiny_bert)) if smoke else
            bert_base_dualcse_case),
        "dualcse_bert_base_v4": lambda: pod_preset_case(16, smoke=smoke),
        "dualcse_bert_base_v5e": lambda: pod_preset_case(64, smoke=smoke),
        "dualcse_bert_base_v4_remat_none": lambda: pod_preset_case(16, remat="none",
                                                                   smoke=smoke),
        "dualcse_bert_base_v5e_remat_none": lambda: pod_preset_case(64, remat="none",
                                                                    smoke=smoke),
    }


def _gb(n: int) -> str:
    return f"{n / 1e9:8.3f} GB"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--only", default="", help="comma-separated cases (default: all)")
    args = parser.parse_args(argv)
    builders = case_builders(args.smoke)
    wanted = [c for c in args.only.split(",") if c] or list(CASES + EXTRA)
    unknown = sorted(set(wanted) - set(CASES + EXTRA))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {list(CASES + EXTRA)}")
    started = time.perf_counter()
    out: dict = {}
    for name in wanted:
        t = time.perf_counter()
        try:
            out[name] = builders[name]()
        except (MemoryError, RuntimeError, ValueError) as err:
            # XLA reports a failed host allocation during compilation as a RuntimeError
            # (XlaRuntimeError RESOURCE_EXHAUSTED); the case is recorded as null.
            out[name] = None
            print(f"{name:32s} null: {type(err).__name__}: {str(err).splitlines()[0][:200]}",
                  flush=True)
            continue
        print(f"{name:32s} temp {_gb(out[name]['temp_bytes'])}  args "
              f"{_gb(out[name]['arg_bytes'])}  per device  ({time.perf_counter() - t:.0f} s)",
              flush=True)
    print(f"total {time.perf_counter() - started:.0f} s{' (smoke sizes)' if args.smoke else ''}")
    for line in [] if args.smoke else _targets(out):  # smoke sizes say nothing of them
        print(line)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
