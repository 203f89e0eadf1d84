"""``train(config, workdir)``: DualCSE / SimCSE through the shared loop."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import jax
import ml_collections

from data_pipelines import dualcse_data, inli, pipeline, snli
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax.loss import dualcse_loss, simcse_loss
from dualcse_jax.model import (
    DualEncoder,
    build_model,
    init_fn,
    length_groups,
    model_inputs,
    pretrained_paths,
    sentence_text_ids,
)
from embedding_core import parallel, training
from embedding_core.pretrained import load_pretrained

CONFIG_FILE = "config.json"


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible settings before anything is loaded or compiled."""
    if config.architecture not in ("cross", "bi", "simcse"):
        raise ValueError(f"config.architecture={config.architecture!r}: use cross, bi or simcse")
    if config.pooling not in ("cls", "cls_mlp", "mean"):
        raise ValueError(f"config.pooling={config.pooling!r}: use cls, cls_mlp or mean")
    if config.train_data not in ("inli", "snli"):
        raise ValueError(f"config.train_data={config.train_data!r}: use inli or snli")
    if config.train_data == "snli" and config.architecture != "simcse":
        raise ValueError("SNLI triplets have no implied entailment: train_data=snli needs "
                         "architecture=simcse")
    for name in ("batch_size", "max_length", "pad_multiple"):
        if int(config[name]) <= 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
    if config.temperature <= 0:
        raise ValueError(f"config.temperature must be positive, got {config.temperature}")


def train_table(config: ml_collections.ConfigDict, tokenizer) -> pipeline.TokenTable:
    """Tokenised training examples (cached per dataset and tokenizer)."""
    if config.train_data == "snli":
        rows = snli.read_snli_triplets(snli.snli_triplets_path())
        table = dualcse_data.simcse_table_from_snli(rows, tokenizer, config.max_length)
    else:
        rows = inli.read_inli(inli.inli_split_path("train"))
        if config.architecture == "simcse":
            table = dualcse_data.simcse_table_from_inli(rows, tokenizer, config.max_length)
        else:
            table = dualcse_data.inli_table(rows, tokenizer, config.max_length,
                                            encoder=config.architecture)
    if config.max_train_examples:
        table = table.take(int(config.max_train_examples))
    return table


def num_steps(config: ml_collections.ConfigDict, num_examples: int) -> int:
    if config.num_train_steps > 0:
        return int(config.num_train_steps)
    per_epoch = pipeline.steps_per_epoch(num_examples, config.batch_size)
    return max(1, math.ceil(per_epoch * config.num_epochs))


def make_loss_fn(model: DualEncoder, config: ml_collections.ConfigDict):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch."""

    def loss_fn(params, batch, rng):
        r, u = model.apply({"params": params}, *model_inputs(batch),
                           deterministic=not config.dropout, rngs={"dropout": rng})
        text_ids = sentence_text_ids(batch["text_ids"], config.architecture)
        if config.architecture == "simcse":
            return simcse_loss(r, text_ids, temperature=config.temperature)
        return dualcse_loss(r, u, text_ids, temperature=config.temperature,
                            use_contradiction=config.use_contradiction,
                            use_intra=config.use_intra)

    return loss_fn


def setup(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
    """Everything ``train`` needs, built without running a step (also used by tests)."""
    validate_config(config)
    training.check_workdir(workdir)
    mesh = parallel.mesh_from_config(config)
    parallel.check_global_batch(config.batch_size, mesh)  # before any compilation
    pretrained = load_pretrained(config.model)
    tokenizer = load_tokenizer(pretrained.model_dir)
    table = train_table(config, tokenizer)
    if table.num_examples < config.batch_size:  # before the workdir is written
        raise ValueError(f"the {config.train_data} training data has {table.num_examples} "
                         f"examples, fewer than one batch (batch_size={config.batch_size})")
    model = build_model(config, pretrained.config)
    steps = num_steps(config, table.num_examples)
    tx, schedule = training.make_optimizer(
        learning_rate=config.learning_rate, total_steps=steps,
        warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
        decay=config.lr_decay, grad_clip_norm=config.grad_clip_norm or None)
    rng = jax.random.key(config.seed)
    init_rng, dropout_rng = jax.random.split(rng)
    state, shardings = training.create_sharded_state(
        init_fn(model, len(table.field_names)), tx, mesh, init_rng,
        pretrained={path: pretrained.params for path in pretrained_paths(config.architecture)})
    step_fn = training.make_train_step(make_loss_fn(model, config), shardings, mesh,
                                       schedule=schedule)
    return dict(mesh=mesh, pretrained=pretrained, tokenizer=tokenizer, table=table,
                model=model, state=state, shardings=shardings, step_fn=step_fn,
                dropout_rng=dropout_rng, num_steps=steps, workdir=Path(workdir))


def _batches(config, table):
    def make(start_step: int):
        return pipeline.make_batches(
            table, global_batch_size=config.batch_size, seed=config.seed, start_step=start_step,
            process_index=jax.process_index(), process_count=jax.process_count(),
            pad_multiple=config.pad_multiple,
            length_groups=length_groups(config.architecture) if config.group_padding else None)

    return make


def save_config(config: ml_collections.ConfigDict, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        tmp = workdir / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True))
        os.replace(tmp, workdir / CONFIG_FILE)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) a DualCSE/SimCSE model into ``workdir``.

    Writes ``workdir/config.json``, TensorBoard events, and orbax checkpoints under
    ``workdir/checkpoints`` (with the data position, so a killed run resumes in order).
    Usable from a notebook: nothing here parses flags.

    Raises:
      ValueError: bad config (e.g. batch not divisible by the data-parallel size), checked
        before compiling. FileNotFoundError: a model path that does not exist.
      data_pipelines.errors.DataError: malformed training data (file, line, field).
    """
    s = setup(config, workdir)
    save_config(config, s["workdir"])
    eval_fn = None
    if config.eval_every:
        from dualcse_jax import evaluate
        from dualcse_jax.inference import Embedder

        val = inli.read_inli(inli.inli_split_path("val"))[: config.eval_examples]
        embedder = Embedder(s["model"], None, s["tokenizer"], config)  # compiled once

        def eval_fn(state, step):
            embedder.params, embedder.step = state.params, step
            out = evaluate.evaluate_rte(embedder, val, val)
            return {f"val_rte_{k}": v for k, v in out.items()}

    logging.info("training %s for %d steps on %d examples, global batch %d, mesh %s",
                 config.architecture, s["num_steps"], s["table"].num_examples,
                 config.batch_size, dict(s["mesh"].shape))
    return training.train_loop(
        workdir=s["workdir"], state=s["state"], state_shardings=s["shardings"],
        train_step=s["step_fn"], make_batches=_batches(config, s["table"]),
        mesh=s["mesh"], num_train_steps=s["num_steps"], rng=s["dropout_rng"], seed=config.seed,
        global_batch_size=config.batch_size, log_every=config.log_every,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        eval_every=config.eval_every, eval_fn=eval_fn, hparams=config.to_dict(),
        stop_after=stop_after)


