"""Compile-only memory cases: per-device bytes of one train step, from abstract inputs.

Each case builds its step on ``ShapeDtypeStruct`` inputs carrying ``NamedSharding``s,
compiles it (``jax.jit(step).lower(...).compile()``) without allocating anything, and reads
XLA's per-device ``memory_analysis()``: ``temp_bytes`` (temporaries) and ``arg_bytes``
(arguments: the sharded state and batch). ``benchmarks/memory_report.py`` gathers the cases;
``docs/docent.md`` holds the figures.

The mesh needs ``mesh_data * mesh_model`` devices: import this module before JAX starts (it
then asks for 8 fake CPU devices), or set
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` yourself. Run as a script to print
the DocEnt cases as JSON (tiled, tiled with the fused table update, untiled)::

  python benchmarks/memory_cases.py --num_entities=10000000 --dim=256 --batch=1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from docent_jax.loss import full_vocab_entity_loss  # noqa: E402
from docent_jax.model import table_rows  # noqa: E402
from embedding_core.distributed import parallel  # noqa: E402
from embedding_core.losses.table_update import TABLE_STATS, FusedTableUpdate  # noqa: E402
from embedding_core.training import training  # noqa: E402


def compiled_bytes(compiled) -> dict[str, int]:
    """``{"temp_bytes", "arg_bytes"}`` per device of a compiled program."""
    analysis = compiled.memory_analysis()
    return {"temp_bytes": int(analysis.temp_size_in_bytes),
            "arg_bytes": int(analysis.argument_size_in_bytes)}


def docent_full_softmax_case(num_entities: int, dim: int, batch: int, mesh_data: int,
                             mesh_model: int, block_size: int,
                             fused: bool = False) -> dict[str, int]:
    """Per-device bytes of one DocEnt-Dual full-softmax step: loss + gradients + Adam.

    The step is ``docent_jax.loss.full_vocab_entity_loss`` (cosine logits with the learned
    scale ``a = exp(log_scale)``, softmax over every entity) on given sentence vectors
    ``[batch, dim]`` (the encoder is left out: its memory does not depend on the table),
    gradients for the table, the scale and the sentence vectors (which the encoder would
    back-propagate), and an ``optax.adam`` update of table and scale with donated state.
    The table (rows padded to a multiple of ``128 * mesh_model``) and its two Adam moments
    are split by rows over ``model`` and replicated over ``data``; the batch is split over
    ``data``. Nothing is allocated: the inputs are ``ShapeDtypeStruct``s.

    ``fused=True`` is ``config.fused_table_update``: the loss runs with the table's
    gradient stopped (``full_vocab_entity_loss(..., fused_table=True)``) and the same Adam
    step is applied block by block
    (``embedding_core.losses.table_update.FusedTableUpdate``), so the table's gradient never
    exists whole; the step also returns the global gradient norm, as the train step logs it.

    Args:
      num_entities: real table rows. dim: vector width. batch: global batch.
      mesh_data, mesh_model: the mesh (``mesh_data * mesh_model`` devices must exist).
      block_size: ``config.vocab_block_size`` (0 = untiled).
      fused: fold the table's Adam update into a blockwise pass (needs ``block_size > 0``).

    Returns:
      ``{"temp_bytes": int, "arg_bytes": int}``: XLA's temporaries and arguments per device.

    Raises:
      ValueError: ``batch`` not divisible by ``mesh_data``, too few devices, or ``fused``
        without ``block_size``.
    """
    if fused and not block_size:
        raise ValueError("the fused table update needs the tiled softmax (block_size > 0)")
    if batch % mesh_data:
        raise ValueError(f"batch {batch} is not divisible by mesh_data={mesh_data}")
    mesh = parallel.make_mesh(mesh_data, mesh_model,
                              devices=jax.devices()[:mesh_data * mesh_model])
    rows = table_rows(num_entities, 128 * mesh_model)
    tx = optax.adam(1e-3)
    table_sharding = NamedSharding(mesh, P("model", None))
    replicated = NamedSharding(mesh, P())
    batch_sharding = NamedSharding(mesh, P("data"))
    params = {"entity_embeddings": jax.ShapeDtypeStruct((rows, dim), jnp.float32,
                                                        sharding=table_sharding),
              "log_scale": jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)}
    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    opt_state = jax.eval_shape(tx.init, params)
    opt_shardings = jax.tree.map(
        lambda leaf: table_sharding if leaf.ndim == 2 else replicated, opt_state)
    opt_state = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                                  sharding=s),
                             opt_state, opt_shardings)
    sentences = jax.ShapeDtypeStruct((batch, dim), jnp.float32,
                                     sharding=NamedSharding(mesh, P("data", None)))
    entity_ids = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=batch_sharding)

    def loss_fn(params, sentences, entity_ids):
        loss, _ = full_vocab_entity_loss(
            sentences, params["entity_embeddings"], entity_ids, jnp.exp(params["log_scale"]),
            mesh, num_entities, block_size)
        return loss

    def step(params, opt_state, sentences, entity_ids):
        loss, (g_params, g_sentences) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
            params, sentences, entity_ids)
        updates, opt_state = tx.update(g_params, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, g_sentences

    update = FusedTableUpdate(("entity_embeddings",), num_entities, max(block_size, 1))

    def fused_loss(params, sentences, entity_ids):
        loss, metrics = full_vocab_entity_loss(
            sentences, params["entity_embeddings"], entity_ids, jnp.exp(params["log_scale"]),
            mesh, num_entities, block_size, fused_table=True)
        return loss, metrics[TABLE_STATS]

    def fused_step(params, opt_state, sentences, entity_ids):
        (loss, stats), (g_params, g_sentences) = jax.value_and_grad(
            fused_loss, argnums=(0, 1), has_aux=True)(params, sentences, entity_ids)
        state = training.TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None,
                                    params=params, tx=tx, opt_state=opt_state)
        state, grad_norm = update.apply_gradients(state, g_params, stats, mesh)
        return state.params, state.opt_state, (loss, grad_norm), g_sentences

    jitted = jax.jit(fused_step if fused else step, donate_argnums=(0, 1),
                     out_shardings=(param_shardings, opt_shardings,
                                    (replicated, replicated) if fused else replicated,
                                    sentences.sharding))
    with jax.set_mesh(mesh):
        compiled = jitted.lower(params, opt_state, sentences, entity_ids).compile()
    return compiled_bytes(compiled)


def dualcse_cross_case(global_batch: int, chunk_size: int, *, seq_len: int = 32,
                       hidden: int = 32, layers: int = 2, mesh_data: int = 8,
                       mesh_model: int = 1) -> dict[str, int]:
    """Per-device bytes of one DualCSE-Cross train step with a tiny encoder.

    The step is the real one: ``dualcse_jax.trainer.make_loss_fn`` (the 5-term loss, 8
    token fields of ``seq_len`` per premise, CLS pooling, dropout on) through
    ``embedding_core.training.training.make_train_step`` with AdamW and donated state, on a random
    BERT of ``layers`` x ``hidden`` (4 heads, MLP 4 x ``hidden``, 30,522 word pieces).
    ``chunk_size > 0`` is ``config.contrastive_chunk_size``: the chunked (GradCache) step,
    whose loss also scores its query rows in chunks; 0 is the plain step, where each
    device scores its ``global_batch / mesh_data`` premises against every key at once.
    Nothing is allocated: state and batch are ``ShapeDtypeStruct``s with their shardings.

    Args:
      global_batch: premises per step (divisible by ``mesh_data``).
      chunk_size: rows per data device in one chunk (dividing the per-device batch), or 0.
      mesh_data, mesh_model: the mesh (``mesh_data * mesh_model`` devices must exist).

    Returns:
      ``{"temp_bytes": int, "arg_bytes": int}`` per device (:func:`dualcse_step_case`).

    Raises:
      ValueError: a batch or chunk size the mesh cannot split.
    """
    from dualcse_jax.configs import default
    from embedding_core.models.encoders import EncoderConfig

    c = default.get_config()
    c.architecture, c.pooling, c.dropout_impl = "cross", "cls", "hash"
    c.batch_size, c.contrastive_chunk_size = global_batch, chunk_size
    c.loss_chunk_size = chunk_size  # the loss scores its query rows in chunks too
    encoder = EncoderConfig(
        model_type="bert", vocab_size=30522, hidden_size=hidden, num_layers=layers,
        num_heads=4, intermediate_size=4 * hidden, max_position_embeddings=512,
        type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0,
        hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
    return dualcse_step_case(c, encoder, seq_len, mesh_data, mesh_model)


def dualcse_step_case(config, encoder, seq_len: int, mesh_data: int, mesh_model: int = 1,
                      ) -> dict[str, int]:
    """Per-device bytes of one DualCSE train step as ``config`` describes it
    (architecture, ``batch_size`` global premises, dtype, remat, chunk sizes, dropout) on
    an ``encoder`` (``EncoderConfig``) and a ``mesh_data x mesh_model`` mesh of the first
    devices; every token field ``seq_len`` long (the longest batch). Abstract inputs only.

    Returns:
      ``{"temp_bytes": int, "arg_bytes": int}``: XLA's temporaries and arguments per device.

    Raises:
      ValueError: a batch or chunk size the mesh cannot split, too few devices.
    """
    import flax.linen as nn

    from dualcse_jax import tables
    from dualcse_jax.model import build_model, init_fn
    from dualcse_jax.trainer import make_loss_fn
    from embedding_core import configs
    from embedding_core.losses import contrastive

    devices = jax.devices()[:mesh_data * mesh_model]
    if len(devices) < mesh_data * mesh_model:
        raise ValueError(f"the mesh {mesh_data}x{mesh_model} needs more than the "
                         f"{len(devices)} devices (XLA_FLAGS device count)")
    mesh = parallel.make_mesh(mesh_data, mesh_model, devices=devices)
    global_batch = int(config.batch_size)
    parallel.check_global_batch(global_batch, mesh)
    split = contrastive.StepSplit.from_config(config)
    split.check(global_batch, mesh)
    model = build_model(config, encoder)
    init = init_fn(model)
    tx, schedule = training.make_optimizer(learning_rate=5e-5, total_steps=1000)
    rules = configs.axis_rules(config)
    shardings = training.state_shardings(init, tx, mesh, rules)

    def init_state(rng):  # the state create_sharded_state builds, as shapes only
        params = nn.unbox(init(rng))
        return training.TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None,
                                   params=params, tx=tx, opt_state=tx.init(params),
                                   first_nonfinite_step=jnp.full((), -1, jnp.int32))

    abstract = jax.eval_shape(init_state, jax.random.key(0))
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    loss_fn = make_loss_fn(model, config)
    split.check_task("DualCSE", loss_fn, None)
    grad = split.value_and_grad(loss_fn, None, mesh, shardings.params)
    step = training.make_train_step(loss_fn, shardings, mesh, schedule=schedule, rules=rules,
                                    value_and_grad=grad)
    rows = NamedSharding(mesh, P("data"))
    fields = len(tables.FIELDS[config.architecture])  # cross: (4 sentences) x 2 indicators
    tokens = jax.ShapeDtypeStruct((global_batch, fields, seq_len), jnp.int32, sharding=rows)
    batch = {"input_ids": tokens, "attention_mask": tokens, "token_type_ids": tokens,
             "text_ids": jax.ShapeDtypeStruct((global_batch, fields), jnp.int32,
                                              sharding=rows)}
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=NamedSharding(mesh, P()))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        compiled = step.jitted.lower(state, batch, key).compile()
    return compiled_bytes(compiled)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num_entities", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--block_size", type=int, default=8192)
    parser.add_argument("--meshes", default="2x4,1x8", help="data x model, comma-separated")
    parser.add_argument("--untiled", default="2x4,1x8", help="meshes also measured untiled")
    parser.add_argument("--fused", default="2x4,1x8",
                        help="meshes also measured tiled with the fused table update")
    args = parser.parse_args(argv)
    out = {}
    untiled = {m for m in args.untiled.split(",") if m}
    fused = {m for m in args.fused.split(",") if m}
    for mesh in (m for m in args.meshes.split(",") if m):
        data, model = (int(x) for x in mesh.split("x"))
        variants = [("tiled", args.block_size, False)]
        if mesh in fused:
            variants.append(("tiled_fused", args.block_size, True))
        if mesh in untiled:
            variants.append(("untiled", 0, False))
        for kind, block, fuse in variants:
            name = f"docent_{mesh}_{kind}"
            out[name] = docent_full_softmax_case(args.num_entities, args.dim, args.batch,
                                                 data, model, block, fused=fuse)
            print(name, out[name], flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
