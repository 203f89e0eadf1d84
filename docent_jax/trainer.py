"""``train(config, workdir)``: DocEnt-Dual as a ``Task`` for ``embedding_core.run``."""

from __future__ import annotations

import os

import jax
import ml_collections
import optax
from jax.sharding import Mesh

from data_pipelines.tokenization import load_tokenizer
from docent_jax import data as docent_data
from docent_jax.configs import validate_config
from docent_jax.loss import make_dual_loss_fn
from docent_jax.model import ENTITY_PARAMS, PRETRAINED_PATH, build_model, init_fn
from embedding_core import training
from embedding_core.pretrained import load_pretrained
from embedding_core.run import default_optimizer, run
from embedding_core.task import Task


def scale_entity_updates(factor: float) -> optax.GradientTransformation:
    """Multiplies the updates of the entity table and scale (``ENTITY_PARAMS``) by ``factor``.

    Chained after AdamW with learning rate ``lr`` this is AdamW with ``factor * lr`` on those
    parameters (Adam's update, weight decay included, is linear in the learning rate), with
    a stateless transformation: no masked optimizer states to shard or checkpoint.
    """

    def update(updates, state, params=None):
        return {key: jax.tree.map(lambda u: u * factor, value) if key in ENTITY_PARAMS
                else value for key, value in updates.items()}, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int):
    """The shared AdamW; the entity table and scale get ``entity_learning_rate`` when set (a
    fresh table learns from scratch while the encoder is fine-tuned: our choice, the paper
    gives no rates)."""
    tx, schedule = default_optimizer(config, total_steps)
    if not config.entity_learning_rate or config.entity_learning_rate == config.learning_rate:
        return tx, schedule
    factor = config.entity_learning_rate / config.learning_rate
    return optax.chain(tx, scale_entity_updates(factor)), schedule


def build_task(config: ml_collections.ConfigDict, mesh: Mesh) -> Task:
    """DocEnt-Dual's ``Task``: pretrained encoder (a bad path fails before any data work),
    SQuAD entity data, the entity-sentence table and, with ``eval_every``, held-out ranking."""
    from data_pipelines import pipeline  # TensorFlow: only once training is certain

    pretrained = load_pretrained(config.model)
    data = docent_data.load_data(config)
    table = docent_data.entity_sentence_table(data.sentences, data.num_entities,
                                              pretrained.model_dir, config.max_length)
    model = build_model(config, pretrained.config, data.num_entities)
    tokenizer, batch = load_tokenizer(pretrained.model_dir), int(config.batch_size)

    def evaluate(params, step):
        from docent_jax.evaluate import evaluate_ranker
        from docent_jax.inference import EntityRanker

        ranker = EntityRanker(model, params, tokenizer, config, data.entity_ids, step=step)
        return {f"heldout_{k}": v for k, v in evaluate_ranker(ranker, data.queries).items()}

    return Task(
        name=f"DocEnt-Dual ({config.softmax} softmax)", init_params=init_fn(model),
        loss_fn=make_dual_loss_fn(model, config, mesh),
        make_batches=lambda start: docent_data.make_batches(
            table, config, start, process_index=jax.process_index(),
            process_count=jax.process_count()),
        num_examples=table.num_examples,
        steps_per_epoch=pipeline.steps_per_epoch(table.num_examples, batch),
        global_batch_size=batch, pretrained={PRETRAINED_PATH: pretrained.params},
        evaluate=evaluate if int(config.eval_every) > 0 else None,
        run_files={docent_data.ENTITY_IDS_FILE: lambda path: docent_data.write_entity_ids(
            path, data.entity_ids)},
        make_optimizer=make_optimizer,
        summary=f"{data.num_entities} entities; {data.description}")


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) DocEnt-Dual into ``workdir`` (see ``embedding_core.run.run``).

    Writes ``config.json``, ``entity_ids.txt`` (line i = row i of the table), TensorBoard
    events and checkpoints (params, optimizer state, data position) under ``workdir``.

    Raises:
      ValueError: bad config (checked before compiling). FileNotFoundError: a model or data
      path that does not exist. data_pipelines.errors.DataError: malformed data.
    """
    return run(build_task, config, workdir, validate=validate_config, stop_after=stop_after)
