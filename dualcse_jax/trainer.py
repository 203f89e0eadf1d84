"""DualCSE / SimCSE training: a ``Task`` for ``embedding_core.training.run``."""

from __future__ import annotations

import os

import ml_collections
from jax.sharding import Mesh

from data_pipelines import sharded_corpus
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax import data
from dualcse_jax.configs import default
from dualcse_jax.evaluate import rte_evaluator
from dualcse_jax.loss import dualcse_loss, simcse_loss
from dualcse_jax.model import DualEncoder, build_model, init_fn, pretrained_paths, sentence_text_ids
from embedding_core import (
    ContrastiveLoss,
    Task,
    encoder_run_files,
    load_pretrained,
    per_example,
    run,
)
from embedding_core.training import training


def make_loss_fn(model: DualEncoder, config: ml_collections.ConfigDict) -> ContrastiveLoss:
    """``(params, batch, rng) -> (loss, metrics)`` split at ``(r, u)`` ``[rows, sentences,
    hidden]`` float32 (simcse: ``(r,)``); row i's dropout key: ``fold_in(step key, i)``."""
    simcse = config.architecture == "simcse"
    row_chunk, tau = int(config.loss_chunk_size), config.temperature

    def embed(params, batch, rows, rng):
        def apply(inputs, key):
            return model.apply({"params": params}, *inputs, deterministic=key is None,
                               rngs={} if key is None else {"dropout": key})

        r, u = per_example(apply, bool(config.dropout))(data.model_inputs(batch), rows, rng)
        return (r,) if simcse else (r, u)

    def loss(params, vectors, batch, rng):
        text_ids = sentence_text_ids(batch["text_ids"], config.architecture)
        if simcse:
            return simcse_loss(vectors[0], text_ids, temperature=tau, row_chunk=row_chunk)
        return dualcse_loss(*vectors, text_ids, temperature=tau, row_chunk=row_chunk,
                            use_contradiction=config.use_contradiction, use_intra=config.use_intra)

    return ContrastiveLoss(embed, loss)


def build_task(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Task:
    """The task of a config; the user's RTE files are read first. ValueError: fewer rows than a
    batch; FileNotFoundError: model, RTE file; DataError (file, line, field)."""
    val = data.val_examples(config) if data.has_own_file(config, "val_file") else None
    if data.has_own_file(config, "test_file"):
        data.test_examples(config)
    pretrained = load_pretrained(config.model)
    tokenizer, batch = load_tokenizer(pretrained.model_dir), int(config.batch_size)
    table = data.train_rows(config, tokenizer, pretrained.model_dir)
    if table.num_examples < batch:  # before the workdir is written
        raise ValueError(f"the training data ({data.train_source(config)}) has "
                         f"{table.num_examples} examples, fewer than one batch "
                         f"(batch_size={config.batch_size})")
    model = build_model(config, pretrained.config)
    return Task(
        name=f"DualCSE-{config.architecture}", init_params=init_fn(model),
        loss_fn=make_loss_fn(model, config), make_batches=data.batch_factory(config, table),
        num_examples=table.num_examples, steps_per_epoch=sharded_corpus.epoch_steps(table, batch),
        global_batch_size=batch, batch_spec=data.batch_spec(config),
        pretrained={path: pretrained.params for path in pretrained_paths(config.architecture)},
        # With eval_files and no val_file of its own, the files replace RTE on INLI val.
        evaluate=rte_evaluator(model, tokenizer, config, val) if config.eval_every > 0
        and (val is not None or not config.eval_files) else None,
        encoder_of=_encoder_of(model, tokenizer, config),
        run_files=encoder_run_files(pretrained.model_dir),
        summary=f"data: {data.train_source(config)}, pooling {config.pooling}",
        logical_axis_sizes={"heads": pretrained.config.num_heads})


def _encoder_of(model, tokenizer, config):
    """``(params, step) -> {"explicit", "implicit": encoder}`` (simcse: the ``Embedder``)."""
    from dualcse_jax.inference import KINDS, Embedder
    from embedding_core.evaluation.run import ViewOf

    embedder = Embedder(model, None, tokenizer, config)
    views = {kind: ViewOf(embedder, {"kind": kind}) for kind in KINDS}

    def of(params, step):
        embedder.params, embedder.step = params, step
        return embedder if config.architecture == "simcse" else views

    return of


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) into ``workdir``; ValueError (config), FileNotFoundError, DataError."""
    return run(build_task, config, workdir, validate=default.validate, stop_after=stop_after)
