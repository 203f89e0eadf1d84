"""DocEnt-Dual, -Full or -Hybrid training: a ``Task`` for ``embedding_core.training.run``."""

from __future__ import annotations

import os

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from data_pipelines import sharded_corpus
from data_pipelines.tokenization import load_tokenizer
from docent_jax import data as docent_data
from docent_jax.configs import validate_config
from docent_jax.corpus import ENTITY_IDS_FILE, keep_entity_ids
from docent_jax.evaluate import eval_subset
from docent_jax.loss import fused_table_update, grad_accumulation, make_loss_fn, masking_config
from docent_jax.model import PRETRAINED_PATH, build_model, init_fn
from docent_jax.optimizer import head_warmup_steps, make_optimizer
from embedding_core import Task, configs, encoder_run_files, load_pretrained, run
from embedding_core.training import training

TASK_NAMES = {"dual": "DocEnt-Dual", "full": "DocEnt-Full", "hybrid": "DocEnt-Hybrid"}


def build_task(config: ml_collections.ConfigDict, mesh: Mesh) -> Task:
    """The pretrained encoder (checked first), the variant's rows, held-out ranking."""
    pretrained = load_pretrained(config.model)
    limit = pretrained.config.max_position_embeddings - pretrained.config.position_offset
    if int(config.max_length) > limit:
        raise ValueError(f"config.max_length={config.max_length} exceeds the {limit} positions "
                         f"of {config.model}; pass --config.max_length={limit} or less")
    data, table = docent_data.training_data(config, pretrained.model_dir)
    model = build_model(config, pretrained.config, data.num_entities)
    tokenizer, batch, variant = load_tokenizer(pretrained.model_dir), int(config.batch_size), \
        config.variant
    layout = docent_data.FullLayout.from_tokenizer(tokenizer) if variant == "full" else None
    steps_per_epoch = sharded_corpus.epoch_steps(table, batch)
    warmup = head_warmup_steps(config, configs.num_train_steps(config, steps_per_epoch))
    if warmup < int(config.mlm_warmup_steps) and config.mlm_head_init == "warmup" and \
            variant != "dual":
        logging.warning("head-only warm-up shortened from %d to %d steps (at most half of the "
                        "run)", int(config.mlm_warmup_steps), warmup)
    queries = eval_subset(data.queries, int(config.get("eval_examples", 0)))
    # A user's query file is not held out from anything: its metrics say where they come from.
    prefix = "queries" if str(config.get("eval_queries_file", "") or "").strip() else "heldout"

    def evaluate(params, step):
        from docent_jax.evaluate import evaluate_ranker

        ranker = _ranker(model, params, tokenizer, config, data.entity_ids, step)
        return {f"{prefix}_{k}": v for k, v in evaluate_ranker(ranker, queries).items()
                } if queries else {}

    return Task(
        name=TASK_NAMES[variant] + (f" ({config.softmax} softmax)" if variant != "full" else ""),
        init_params=init_fn(model), loss_fn=make_loss_fn(
            model, config, mesh, masking_config(config, tokenizer) if variant != "dual" else None),
        make_batches=lambda start: docent_data.make_batches(
            table, config, start, process_index=jax.process_index(),
            process_count=jax.process_count(), full_layout=layout, warmup_steps=warmup),
        num_examples=table.num_examples, steps_per_epoch=steps_per_epoch,
        global_batch_size=batch, pretrained={PRETRAINED_PATH: pretrained.params},
        evaluate=evaluate if int(config.eval_every) > 0 else None,
        encoder_of=lambda params, step: _ranker(model, params, tokenizer, config,
                                                data.entity_ids, step),
        run_files={ENTITY_IDS_FILE: lambda path: keep_entity_ids(path, data.entity_ids),
                   **encoder_run_files(pretrained.model_dir)},
        make_optimizer=make_optimizer, grad_accumulation=grad_accumulation(config),
        table_update=fused_table_update(config, data.num_entities),
        summary=f"{data.num_entities} entities; {data.description}",
        logical_axis_sizes={"heads": pretrained.config.num_heads},
        batch_spec=docent_data.batch_spec(variant, warmup))


def _ranker(model, params, tokenizer, config, entity_ids, step):
    """An ``EntityRanker`` on the training params: its query encoder for eval files."""
    from docent_jax.inference import EntityRanker

    return EntityRanker(model, params, tokenizer, config, entity_ids, step=step)


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) into ``workdir``; ValueError (config), FileNotFoundError, DataError."""
    return run(build_task, config, workdir, validate=validate_config, stop_after=stop_after)
