"""``train(config, workdir)``: DocEnt-Dual through the shared loop."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import jax
import ml_collections
import optax

from data_pipelines.tokenization import load_tokenizer
from docent_jax import data as docent_data
from docent_jax.loss import LOSSES, full_softmax_entity_loss, in_batch_entity_loss
from docent_jax.model import ENTITY_PARAMS, PRETRAINED_PATH, DocEntDual, build_model, init_fn
from embedding_core import parallel, training
from embedding_core.pretrained import load_pretrained

CONFIG_FILE = "config.json"
ENTITY_IDS_FILE = "entity_ids.txt"


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible settings before anything is loaded or compiled.

    Raises:
      ValueError: naming the field and the allowed values.
    """
    if config.loss not in LOSSES:
        raise ValueError(f"config.loss={config.loss!r}: use one of {LOSSES}")
    if config.pooling not in ("cls", "mean"):
        raise ValueError(f"config.pooling={config.pooling!r}: use cls or mean")
    if config.train_data != "squad":
        raise ValueError(f"config.train_data={config.train_data!r}: only 'squad' is wired")
    for name in ("batch_size", "max_length", "pad_multiple", "table_multiple"):
        if int(config[name]) <= 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
    if config.projection_dim < 0:
        raise ValueError(f"config.projection_dim must be >= 0, got {config.projection_dim}")
    if config.scale_init <= 0:
        raise ValueError(f"config.scale_init must be positive, got {config.scale_init}")
    if config.mesh_model > 0 and config.table_multiple % config.mesh_model:
        raise ValueError(f"config.table_multiple={config.table_multiple} must be divisible by "
                         f"config.mesh_model={config.mesh_model} (the table is split over it)")


def load_data(config: ml_collections.ConfigDict) -> docent_data.EntityData:
    """The entities, training sentences and held-out queries a config names."""
    return docent_data.squad_entity_data(config.squad_path or None,
                                         float(config.heldout_fraction), int(config.split_seed))


def num_steps(config: ml_collections.ConfigDict, num_examples: int) -> int:
    if config.num_train_steps > 0:
        return int(config.num_train_steps)
    from data_pipelines import pipeline  # TensorFlow: only once training is certain

    per_epoch = pipeline.steps_per_epoch(num_examples, config.batch_size)
    return max(1, math.ceil(per_epoch * config.num_epochs))


def scale_entity_updates(factor: float) -> optax.GradientTransformation:
    """Multiplies the updates of the entity table and scale (``ENTITY_PARAMS``) by ``factor``.

    Chained after AdamW with learning rate ``lr`` this is AdamW with ``factor * lr`` on those
    parameters (Adam's update, weight decay included, is linear in the learning rate), with
    a stateless transformation: no masked optimizer states to shard or checkpoint.
    """

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return {key: jax.tree.map(lambda u: u * factor, value) if key in ENTITY_PARAMS
                else value for key, value in updates.items()}, state

    return optax.GradientTransformation(init, update)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with warm-up/decay (``embedding_core.training.make_optimizer``); the entity
    table and scale get ``entity_learning_rate`` when it is set (a fresh table learns from
    scratch while the encoder is fine-tuned: our choice, the paper gives no rates)."""
    tx, schedule = training.make_optimizer(
        learning_rate=config.learning_rate, total_steps=total_steps,
        warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
        decay=config.lr_decay, grad_clip_norm=config.grad_clip_norm or None)
    if not config.entity_learning_rate or config.entity_learning_rate == config.learning_rate:
        return tx, schedule
    factor = config.entity_learning_rate / config.learning_rate
    return optax.chain(tx, scale_entity_updates(factor)), schedule


def make_loss_fn(model: DocEntDual, config: ml_collections.ConfigDict, mesh):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch.

    The batch's ``text_ids[:, 0]`` are the entity indices (see ``docent_jax.data``).
    """

    def loss_fn(params, batch, rng):
        sentences, table, scale = model.apply(
            {"params": params}, batch["input_ids"], batch["attention_mask"],
            batch["token_type_ids"], deterministic=not config.dropout, rngs={"dropout": rng})
        entity_ids = batch["text_ids"][:, 0]
        if config.loss == "full":
            return full_softmax_entity_loss(sentences, table, entity_ids, scale, mesh,
                                            model.num_entities)
        return in_batch_entity_loss(sentences, table[entity_ids], entity_ids, scale)

    return loss_fn


def setup(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
    """Everything ``train`` needs, built without running a step (also used by tests)."""
    validate_config(config)
    training.check_workdir(workdir)
    mesh = parallel.mesh_from_config(config)
    parallel.check_global_batch(config.batch_size, mesh)  # before any compilation
    pretrained = load_pretrained(config.model)  # a bad model path fails before data work
    tokenizer = load_tokenizer(pretrained.model_dir)
    data = load_data(config)
    table = docent_data.entity_sentence_table(data.sentences, data.num_entities,
                                              pretrained.model_dir, config.max_length)
    model = build_model(config, pretrained.config, data.num_entities)
    steps = num_steps(config, table.num_examples)
    tx, schedule = make_optimizer(config, steps)
    init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
    state, shardings = training.create_sharded_state(
        init_fn(model), tx, mesh, init_rng, pretrained={PRETRAINED_PATH: pretrained.params})
    step_fn = training.make_train_step(make_loss_fn(model, config, mesh), shardings, mesh,
                                       schedule=schedule)
    return dict(mesh=mesh, pretrained=pretrained, tokenizer=tokenizer, data=data, table=table,
                model=model, state=state, shardings=shardings, step_fn=step_fn,
                dropout_rng=dropout_rng, num_steps=steps, workdir=Path(workdir))


def _batches(config, table):
    from data_pipelines import pipeline

    def make(start_step: int):
        return pipeline.make_batches(
            table, global_batch_size=config.batch_size, seed=config.seed, start_step=start_step,
            process_index=jax.process_index(), process_count=jax.process_count(),
            pad_multiple=config.pad_multiple)

    return make


def save_run_files(config: ml_collections.ConfigDict, workdir: Path,
                   entity_ids: list[str]) -> None:
    """``config.json`` and ``entity_ids.txt`` (row i of the table = line i), atomically."""
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() != 0:
        return
    tmp = workdir / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    os.replace(tmp, workdir / CONFIG_FILE)
    docent_data.write_entity_ids(workdir / ENTITY_IDS_FILE, entity_ids)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) DocEnt-Dual into ``workdir``.

    Writes ``workdir/config.json``, ``workdir/entity_ids.txt``, TensorBoard events and orbax
    checkpoints under ``workdir/checkpoints`` (with the data position, so a killed run
    resumes in order). Nothing here parses flags.

    Raises:
      ValueError: bad config (checked before compiling). FileNotFoundError: a model or data
      path that does not exist. data_pipelines.errors.DataError: malformed data.
    """
    s = setup(config, workdir)
    save_run_files(config, s["workdir"], s["data"].entity_ids)
    eval_fn = None
    if config.eval_every:
        from docent_jax import evaluate
        from docent_jax.inference import EntityRanker

        def eval_fn(state, step):
            ranker = EntityRanker(s["model"], state.params, s["tokenizer"], config,
                                  s["data"].entity_ids, step=step)
            out = evaluate.evaluate_ranker(ranker, s["data"].queries)
            return {f"heldout_{k}": v for k, v in out.items()}

    logging.info("training DocEnt-Dual (%s softmax) for %d steps on %d sentences of %d "
                 "entities, global batch %d, mesh %s", config.loss, s["num_steps"],
                 s["table"].num_examples, s["data"].num_entities, config.batch_size,
                 dict(s["mesh"].shape))
    return training.train_loop(
        workdir=s["workdir"], state=s["state"], state_shardings=s["shardings"],
        train_step=s["step_fn"], make_batches=_batches(config, s["table"]), mesh=s["mesh"],
        num_train_steps=s["num_steps"], rng=s["dropout_rng"], seed=config.seed,
        global_batch_size=config.batch_size, log_every=config.log_every,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        eval_every=config.eval_every, eval_fn=eval_fn, hparams=config.to_dict(),
        stop_after=stop_after)
