"""``train(config, workdir)``: DualCSE / SimCSE as a ``Task`` for ``embedding_core.run``."""

from __future__ import annotations

import os

import ml_collections
from jax.sharding import Mesh

from data_pipelines import inli, sharded_corpus
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax import data
from dualcse_jax.configs import validate_config
from dualcse_jax.loss import dualcse_loss, simcse_loss
from dualcse_jax.model import (
    DualEncoder,
    build_model,
    init_fn,
    model_inputs,
    pretrained_paths,
    sentence_text_ids,
)
from embedding_core import training
from embedding_core.contrastive import ContrastiveLoss, per_example
from embedding_core.pretrained import encoder_run_files, load_pretrained
from embedding_core.run import run
from embedding_core.task import Task


def make_loss_fn(model: DualEncoder, config: ml_collections.ConfigDict) -> ContrastiveLoss:
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch, split at the
    sentence vectors (``embedding_core.contrastive.ContrastiveLoss``), so that
    ``config.contrastive_chunk_size`` can chunk it.

    The embeddings are ``(r, u)`` ``[rows, sentences, hidden]`` float32 (``(r,)`` for
    simcse); with dropout each row (an example with all its sentences) is encoded with the
    key ``fold_in(step key, row)`` (``contrastive.per_example``). With
    ``config.contrastive_chunk_size`` the loss scores its query rows in chunks of that size
    too (``row_chunk``), so no device holds its rows' full score matrix.
    """
    simcse = config.architecture == "simcse"
    row_chunk = int(config.get("contrastive_chunk_size", 0))  # the loss's query chunks

    def embed(params, batch, rows, rng):
        def apply(inputs, key):
            return model.apply({"params": params}, *inputs, deterministic=key is None,
                               rngs={} if key is None else {"dropout": key})

        r, u = per_example(apply, bool(config.dropout))(model_inputs(batch), rows, rng)
        return (r,) if simcse else (r, u)

    def loss(params, vectors, batch, rng):
        text_ids = sentence_text_ids(batch["text_ids"], config.architecture)
        if simcse:
            return simcse_loss(vectors[0], text_ids, temperature=config.temperature,
                               row_chunk=row_chunk)
        return dualcse_loss(*vectors, text_ids, temperature=config.temperature,
                            use_contradiction=config.use_contradiction,
                            use_intra=config.use_intra, row_chunk=row_chunk)

    return ContrastiveLoss(embed, loss)


def rte_evaluator(model: DualEncoder, tokenizer, config: ml_collections.ConfigDict,
                  val: list[inli.INLIExample] | None = None):
    """``(params, step) -> {val_rte_*}``: RTE on the first ``eval_examples`` val premises
    (``val``, else read from ``config.val_file``, else INLI val)."""
    from dualcse_jax.evaluate import evaluate_rte
    from dualcse_jax.inference import Embedder

    val = (data.val_examples(config) if val is None else val)[: config.eval_examples]
    embedder = Embedder(model, None, tokenizer, config)  # compiled once

    def evaluate(params, step):
        embedder.params, embedder.step = params, step
        return {f"val_rte_{k}": v for k, v in evaluate_rte(embedder, val, val).items()}

    return evaluate


def build_task(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Task:
    """The DualCSE training task a config describes (data and MiniLM weights load here).

    Raises:
      ValueError: fewer training examples than one batch. FileNotFoundError: no model, or
        no ``val_file``/``test_file``.
      data_pipelines.errors.DataError: malformed training data, or a malformed
        ``val_file``/``test_file`` (file, line, field).
    """
    # The user's evaluation files are read now, so a fault in them stops the run before
    # training rather than after it (evaluate reads the test file again; it is small).
    val = data.val_examples(config) if data.has_own_file(config, "val_file") else None
    if data.has_own_file(config, "test_file"):
        data.test_examples(config)
    pretrained = load_pretrained(config.model)
    tokenizer = load_tokenizer(pretrained.model_dir)
    table = data.train_rows(config, tokenizer, pretrained.model_dir)
    if table.num_examples < config.batch_size:  # before the workdir is written
        raise ValueError(f"the training data ({data.train_source(config)}) has "
                         f"{table.num_examples} examples, fewer than one batch "
                         f"(batch_size={config.batch_size})")
    model = build_model(config, pretrained.config)
    return Task(
        name=f"DualCSE-{config.architecture}", init_params=init_fn(model),
        loss_fn=make_loss_fn(model, config), make_batches=data.batch_factory(config, table),
        num_examples=table.num_examples,
        steps_per_epoch=sharded_corpus.epoch_steps(table, int(config.batch_size)),
        global_batch_size=int(config.batch_size),
        pretrained={path: pretrained.params for path in pretrained_paths(config.architecture)},
        evaluate=rte_evaluator(model, tokenizer, config, val) if config.eval_every > 0 else None,
        run_files=encoder_run_files(pretrained.model_dir),
        summary=f"data: {data.train_source(config)}, pooling {config.pooling}",
        logical_axis_sizes={"heads": pretrained.config.num_heads})


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) a DualCSE/SimCSE model into ``workdir``.

    Writes ``workdir/run_config.json``, ``workdir/encoder/`` (the encoder's HF config and
    tokenizer files), TensorBoard events, and orbax checkpoints under
    ``workdir/checkpoints`` (with the data position, so a killed run resumes in order).
    Usable from a notebook: nothing here parses flags.

    Raises:
      ValueError: bad config (e.g. batch not divisible by the data-parallel size), checked
        before compiling. FileNotFoundError: a model path that does not exist.
      data_pipelines.errors.DataError: malformed training data (file, line, field).
    """
    return run(build_task, config, workdir, validate=validate_config, stop_after=stop_after)
