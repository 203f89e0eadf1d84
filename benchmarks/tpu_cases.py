"""The programs a pod run compiles, built on abstract inputs for a TPU slice.

Each builder returns ``(compiled, examples)``: the executable ``benchmarks/tpu_compile.py``
analyses and the examples one call processes (whole mesh). Nothing is allocated: state and
batch are ``ShapeDtypeStruct``s carrying their ``NamedSharding``s.

- :func:`train_step`: a preset's train step as ``embedding_core.training.run`` builds it (the
  package's model, loss, batch contract, optimizer, GradCache / accumulation, fused table
  update, logical-axis rules fitted to the mesh, donated state); token fields at
  ``config.max_length`` (the longest batch). DualCSE, DocEnt (Dual, Full, Hybrid).
- :func:`encode_batch`: one ``embedding-jax encode`` batch, the encoder + pooling +
  normalisation of ``embedding_core.serving.st_models.PretrainedEncoder``, batch split over the
  slice (parameters replicated).
- :func:`ranking_block`: DocEnt's entity ranking, one query block against the table split
  by rows over ``model`` (``embedding_core.losses.table_ranking.top_k``).
- :func:`mrwe_features`: MRWE's contextual feature pass (BERT-base hidden states of every
  layer for ``contextual_batch_size`` windows), the part of an MRWE run a TPU speeds up.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import tpu_compile  # noqa: F401  (TPU_LIBRARY_PATH, read when a topology is made)
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.losses import contrastive
from embedding_core.models.encoders import EncoderConfig
from embedding_core.training import training

BERT_BASE = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
             "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "max_position_embeddings": 512, "type_vocab_size": 2}
"""``google-bert/bert-base-uncased``'s shape (its config.json), so no download is needed."""
TINY_BERT = {**BERT_BASE, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 64}
"""The tests' tiny BERT (``tests/conftest.py``'s ``tiny_bert_dir`` shape)."""
DOCENT_ENTITIES = 81_057
"""The paper's Amazon Movies & TV entities (``docent_jax/configs/dual_paper.py``)."""


def encoder_config(shape: dict) -> EncoderConfig:
    """An :class:`EncoderConfig` of an HF ``config.json`` dict (dropout 0.1, GELU)."""
    return EncoderConfig.from_hf_config({"hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                                         "attention_probs_dropout_prob": 0.1,
                                         "layer_norm_eps": 1e-12, "pad_token_id": 0, **shape})


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def _batch(spec, sizes: dict, mesh: Mesh) -> dict:
    """Abstract int32 / float32 arrays of a ``task.BatchSpec``, named dims from ``sizes``,
    split by rows over ``data``."""
    rows = NamedSharding(mesh, P("data"))
    dtypes = {"int": jnp.int32, "float": jnp.float32, "bool": jnp.bool_}
    return {name: jax.ShapeDtypeStruct(
        tuple(d if isinstance(d, int) else sizes[d] for d in field.shape), dtypes[field.kind],
        sharding=rows) for name, field in spec.items()}


def _compile_step(name: str, config, mesh: Mesh, init_params, loss_fn, batch: dict, *,
                  optimizer=None, accumulation=None, table_update=None, heads: int = 12,
                  compile: bool = True):
    """``embedding_core.training.run._train``'s step, compiled on abstract state and batch
    (``compile=False``: only lowered, for the default tier's check on CPU devices)."""
    abstract_params = jax.eval_shape(init_params, jax.random.key(0))
    rules = parallel.fit_rules(configs.axis_rules(config), mesh, abstract_params,
                               {"heads": heads})
    parallel.check_global_batch(int(config.batch_size), mesh)
    split = contrastive.StepSplit.from_config(config)
    split.check(int(config.batch_size), mesh)
    if optimizer is None:
        from embedding_core.training.run import default_optimizer as optimizer
    tx, schedule = optimizer(config, 1000)
    shardings = training.state_shardings(init_params, tx, mesh, rules)

    def init_state(rng):
        params = nn.unbox(init_params(rng))
        return training.TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None,
                                   params=params, tx=tx, opt_state=tx.init(params),
                                   first_nonfinite_step=jnp.full((), -1, jnp.int32))

    state = _abstract(jax.eval_shape(init_state, jax.random.key(0)), shardings)
    split.check_task(name, loss_fn, accumulation)
    grad = split.value_and_grad(loss_fn, accumulation, mesh, shardings.params)
    step = training.make_train_step(loss_fn, shardings, mesh, schedule=schedule, rules=rules,
                                    value_and_grad=grad, table_update=table_update)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P()))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        lowered = step.jitted.lower(state, batch, key)
    return lowered.compile() if compile else lowered


def dualcse_step(config: ml_collections.ConfigDict, encoder: EncoderConfig, mesh: Mesh,
                 compile: bool = True):
    """A DualCSE / SimCSE preset's train step (``dualcse_jax.trainer.build_task``)."""
    from dualcse_jax import data, tables
    from dualcse_jax.model import build_model, init_fn
    from dualcse_jax.trainer import make_loss_fn

    model = build_model(config, encoder)
    fields = len(tables.FIELDS[config.architecture])
    seq = int(config.max_length)
    sizes = {"batch": int(config.batch_size), "fields": fields, "fields0": 1,
             "fields1": fields - 1, "seq": seq, "seq0": seq, "seq1": seq}
    batch = _batch(data.batch_spec(config), sizes, mesh)
    compiled = _compile_step(f"DualCSE-{config.architecture}", config, mesh, init_fn(model),
                             make_loss_fn(model, config), batch, heads=encoder.num_heads,
                             compile=compile)
    return compiled, int(config.batch_size)


def sentence_step(config: ml_collections.ConfigDict, encoder: EncoderConfig, mesh: Mesh,
                  columns: int = 3, compile: bool = True):
    """A sentence-jax preset's train step (``sentence_jax.trainer.build_task``): ``columns``
    texts a row (anchor, positive, hard negative), the model's mean pooling."""
    from embedding_core import BatchField
    from embedding_core.serving.st_models import Pipeline
    from sentence_jax.configs import default
    from sentence_jax.model import build_model, init_fn
    from sentence_jax.trainer import make_loss_fn

    model = build_model(config, encoder, Pipeline())
    spec = {n: BatchField("int", ("batch", columns, "seq"))
            for n in ("input_ids", "attention_mask", "token_type_ids")}
    spec["text_ids"] = BatchField("int", ("batch", columns))
    batch = _batch(spec, {"batch": int(config.batch_size),
                          "seq": int(config.max_seq_length) or 128}, mesh)
    loss = make_loss_fn(model, default.make_loss(config), bool(config.dropout))
    compiled = _compile_step("sentence-jax", config, mesh, init_fn(model), loss, batch,
                             heads=encoder.num_heads, compile=compile)
    return compiled, int(config.batch_size)


def docent_step(config: ml_collections.ConfigDict, encoder: EncoderConfig, mesh: Mesh,
                num_entities: int = DOCENT_ENTITIES, compile: bool = True):
    """A DocEnt preset's train step (``docent_jax.trainer.build_task``) over
    ``num_entities`` entities; Full and Hybrid mask with bert-base-uncased's special ids."""
    from docent_jax import data, loss
    from docent_jax.masking import MaskingConfig
    from docent_jax.model import build_model, init_fn
    from docent_jax.optimizer import make_optimizer

    model = build_model(config, encoder, num_entities)
    variant = config.variant
    masking = None
    if variant != "dual":  # bert-base-uncased's [PAD] [CLS] [SEP] [MASK] [UNK]
        masking = MaskingConfig(
            mask_token_id=103, word_vocab_size=encoder.vocab_size,
            special_token_ids=(0, 100, 101, 102, 103),
            word_mask_rate=float(config.word_mask_rate),
            entity_mask_rate=float(config.entity_mask_rate),
            max_predictions=int(config.max_predictions))
    seq = int(config.max_length) + (2 if variant == "full" else 0)
    batch = _batch(data.batch_spec(variant), {"batch": int(config.batch_size), "seq": seq},
                   mesh)
    compiled = _compile_step(
        f"DocEnt-{variant}", config, mesh, init_fn(model),
        loss.make_loss_fn(model, config, mesh, masking), batch, optimizer=make_optimizer,
        accumulation=loss.grad_accumulation(config),
        table_update=loss.fused_table_update(config, num_entities), heads=encoder.num_heads,
        compile=compile)
    return compiled, int(config.batch_size)


def encode_batch(encoder: EncoderConfig, mesh: Mesh, batch: int, seq: int = 128):
    """One encode batch of ``batch`` texts x ``seq`` tokens: mean pooling, normalised."""
    from embedding_core.models.encoders import TransformerEncoder
    from embedding_core.serving.st_models import pool

    module = TransformerEncoder(encoder)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(jax.eval_shape(
        lambda r: module.init({"params": r}, ids, ids, ids)["params"], jax.random.key(0)))

    def forward(params, ids, mask, types):
        hidden = module.apply({"params": params}, ids, mask, types).last_hidden_state
        x = pool(hidden, mask, ("mean",))
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    rows = NamedSharding(mesh, P("data"))
    params = _abstract(params, jax.tree.map(lambda _: NamedSharding(mesh, P()), params))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=rows)
    compiled = jax.jit(forward, out_shardings=rows).lower(params, tokens, tokens,
                                                          tokens).compile()
    return compiled, batch


def mrwe_features(encoder: EncoderConfig, mesh: Mesh, batch: int, seq: int = 128):
    """MRWE's contextual pass: every layer's hidden states of ``batch`` windows (float32,
    forward only; ``mrwe_jax/features``), the batch split over the slice."""
    from embedding_core.models.encoders import TransformerEncoder

    module = TransformerEncoder(encoder)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(jax.eval_shape(
        lambda r: module.init({"params": r}, ids, ids, ids)["params"], jax.random.key(0)))

    def forward(params, ids, mask, types):
        out = module.apply({"params": params}, ids, mask, types, output_hidden_states=True)
        return jnp.stack(out.hidden_states[-4:], axis=1).astype(jnp.float32)

    rows = NamedSharding(mesh, P("data"))
    params = _abstract(params, jax.tree.map(lambda _: NamedSharding(mesh, P()), params))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=rows)
    compiled = jax.jit(forward, out_shardings=rows).lower(params, tokens, tokens,
                                                          tokens).compile()
    return compiled, batch


def ranking_block(mesh: Mesh, queries: int, num_entities: int = DOCENT_ENTITIES,
                  dim: int = 768, k: int = 100, row_block: int = 8192):
    """DocEnt's top-``k`` entity ranking of ``queries`` query vectors against the table
    (rows padded to the ``model`` size, split over it), scored ``row_block`` rows at a
    time with the Dual cosine score (``docent_jax.inference``)."""
    from docent_jax.inference import _dual_table_scores
    from docent_jax.model import table_rows
    from embedding_core.losses import table_ranking

    model = mesh.shape["model"]
    rows = table_rows(num_entities, 128 * model)
    per_shard = rows // model
    block = table_ranking._block_size(row_block, per_shard, min(k, per_shard))
    fn = table_ranking._top_k_fn(_dual_table_scores, k, num_entities, per_shard, block, mesh,
                                 "data", "model", 0, 1)
    q = jax.ShapeDtypeStruct((queries, dim), jnp.float32,
                             sharding=NamedSharding(mesh, P("data", None)))
    table = jax.ShapeDtypeStruct((rows, dim), jnp.float32,
                                 sharding=NamedSharding(mesh, P("model", None)))
    scale = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))
    return fn.lower(q, table, (), (scale,)).compile(), queries
