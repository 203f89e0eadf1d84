"""Memory of one full-softmax train step over a large entity table: vocab-parallel vs dense.

One step = loss + gradients (queries and table) + an Adam update of the table, for
``scale * cos(q, table)`` logits and cross-entropy against each query's entity, in three forms:

* ``vocab_parallel``:
  ``embedding_core.losses.vocab_softmax.vocab_parallel_softmax_cross_entropy`` with the
  table sharded by rows over "model" and the batch over "data" (shard_map);
* ``dense_gspmd``: the dense ``optax.softmax_cross_entropy_with_integer_labels`` on the full
  ``[batch, num_entities]`` logits, jitted with the same input shardings (XLA's SPMD
  partitioner decides how to split it);
* ``dense_one_device``: the dense form on a single device (what an unsharded run costs).

For each: XLA's ``compiled.memory_analysis()`` of the per-device program (temporaries,
arguments, outputs), the loss, and the process's peak RSS after running it
(``resource.getrusage``; cumulative, so forms run in the order above).

Full size, by hand (about 1-2 GB of RAM)::

    python benchmarks/docent_vocab_memory.py --num_entities=1000000 --dim=64 --batch=256

Prints one JSON object (also written to ``--json`` if given). The 8 devices are fake CPU
devices unless ``XLA_FLAGS`` already sets a count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from embedding_core.distributed import parallel  # noqa: E402
from embedding_core.losses import losses, vocab_softmax  # noqa: E402

SCALE = 20.0


def _memory(compiled) -> dict[str, int]:
    analysis = compiled.memory_analysis()
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes")
    return {f: int(getattr(analysis, f, 0) or 0) for f in fields}


def _peak_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _step(loss_fn, tx):
    def step(table, opt_state, queries, targets):
        loss, (g_table, g_queries) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            table, queries, targets)
        updates, opt_state = tx.update(g_table, opt_state, table)
        return optax.apply_updates(table, updates), opt_state, loss, g_queries

    return step


def _run(name, step, table, opt_state, queries, targets, in_shardings, out_shardings):
    jitted = jax.jit(step, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=(0, 1))
    t0 = time.perf_counter()
    compiled = jitted.lower(table, opt_state, queries, targets).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    new_table, _, loss, g_queries = compiled(table, opt_state, queries, targets)
    loss = float(loss)
    run_s = time.perf_counter() - t0
    return {"form": name, "loss": loss, "compile_s": round(compile_s, 2),
            "step_s": round(run_s, 3), "memory_per_device": _memory(compiled),
            "peak_rss_bytes_after": _peak_rss_bytes(),
            "grad_queries_norm": float(jnp.linalg.norm(g_queries)),
            "table_moved": float(jnp.max(jnp.abs(new_table[:1024])) > 0)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_entities", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--mesh_data", type=int, default=2)
    parser.add_argument("--mesh_model", type=int, default=4)
    parser.add_argument("--forms", default="vocab_parallel,dense_gspmd,dense_one_device")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)

    mesh = parallel.make_mesh(args.mesh_data, args.mesh_model)
    rng = np.random.default_rng(0)
    queries_np = rng.standard_normal((args.batch, args.dim)).astype(np.float32)
    targets_np = rng.integers(0, args.num_entities, args.batch).astype(np.int32)
    tx = optax.adam(1e-3)

    table_sharding = NamedSharding(mesh, P("model", None))
    batch_sharding = NamedSharding(mesh, P("data"))
    abstract_opt = jax.eval_shape(
        tx.init, jax.ShapeDtypeStruct((args.num_entities, args.dim), jnp.float32))
    opt_shardings = jax.tree.map(
        lambda leaf: table_sharding if leaf.ndim == 2 else NamedSharding(mesh, P()),
        abstract_opt)

    def make_table(sharding):
        # Built on device in its final layout: the host never holds the whole table.
        return jax.jit(lambda k: 0.02 * jax.random.normal(k, (args.num_entities, args.dim)),
                       out_shardings=sharding)(jax.random.key(1))

    def vp_loss(table, queries, targets):
        return jnp.mean(vocab_softmax.vocab_parallel_softmax_cross_entropy(
            queries, table, targets, mesh, SCALE))

    def dense_loss(table, queries, targets):
        logits = SCALE * losses.cosine_similarity_matrix(queries, table)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    results = []
    forms = [f for f in args.forms.split(",") if f]
    for form in forms:
        if form in ("vocab_parallel", "dense_gspmd"):
            table = make_table(table_sharding)
            opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(table)
            queries = jax.device_put(queries_np, batch_sharding)
            targets = jax.device_put(targets_np, batch_sharding)
            in_sh = (table_sharding, opt_shardings, batch_sharding, batch_sharding)
            out_sh = (table_sharding, opt_shardings, NamedSharding(mesh, P()), batch_sharding)
            fn = vp_loss if form == "vocab_parallel" else dense_loss
            with jax.set_mesh(mesh):
                results.append(_run(form, _step(fn, tx), table, opt_state, queries, targets,
                                    in_sh, out_sh))
        elif form == "dense_one_device":
            one = NamedSharding(parallel.make_mesh(1, 1, devices=jax.devices()[:1]), P())
            table = make_table(one)
            opt_state = jax.jit(tx.init, out_shardings=one)(table)
            queries = jax.device_put(queries_np, one)
            targets = jax.device_put(targets_np, one)
            results.append(_run(form, _step(dense_loss, tx), table, opt_state, queries,
                                targets, one, one))
        else:
            raise SystemExit(f"unknown form {form!r}")
        del table, opt_state

    out = {
        "num_entities": args.num_entities, "dim": args.dim, "batch": args.batch,
        "mesh": {"data": args.mesh_data, "model": args.mesh_model},
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "full_logits_bytes": args.batch * args.num_entities * 4,
        "table_bytes": args.num_entities * args.dim * 4,
        "results": results,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return out


if __name__ == "__main__":
    main()
