"""``train(config, workdir)``: DocEnt-Dual, -Full or -Hybrid (``config.variant``) as a
``Task`` for ``embedding_core.run``."""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from data_pipelines import sharded_corpus
from data_pipelines.tokenization import load_tokenizer
from docent_jax import data as docent_data
from docent_jax.configs import validate_config
from docent_jax.loss import make_loss_fn, masking_config
from docent_jax.model import PRETRAINED_PATH, build_model, init_fn
from docent_jax.optimizer import head_warmup_steps, make_optimizer
from embedding_core import configs, training
from embedding_core.contrastive import GradAccumulation
from embedding_core.pretrained import encoder_run_files, load_pretrained
from embedding_core.run import run
from embedding_core.table_update import FusedTableUpdate
from embedding_core.task import Task

TASK_NAMES = {"dual": "DocEnt-Dual", "full": "DocEnt-Full", "hybrid": "DocEnt-Hybrid"}


def eval_subset(queries: Sequence, limit: int) -> list:
    """``limit`` evenly spaced items of ``queries`` (all when ``limit`` is 0 or larger).

    Held-out queries come grouped by article, so a prefix would see a few entities only;
    item ``floor(i * n / limit)`` for ``i < limit`` covers the whole list in its order.
    """
    n = len(queries)
    if limit <= 0 or limit >= n:
        return list(queries)
    return [queries[i * n // limit] for i in range(limit)]


def grad_accumulation(config: ml_collections.ConfigDict) -> GradAccumulation | None:
    """How ``config.grad_accum_steps`` accumulates ``config.variant``'s loss: DocEnt-Full
    only (Dual chunks its in-batch loss with ``contrastive_chunk_size`` instead; Hybrid
    does neither).

    Micro-batch k draws its masks from ``fold_in(step key, k)`` and its gradient is
    weighted by its masked-token count: the masked word pieces (``L_MLM``'s per-token mean
    over the micro-batches is then the mean over all their masked word pieces, exactly),
    with ``single_cross_entropy`` the masked word pieces and entities (the whole loss is
    then exactly the mean over all masked tokens). ``L_E``'s mean is weighted by word-piece
    counts in the two-term form (``docs/docent.md``).
    """
    if config.get("variant", "dual") != "full":
        return None
    counts = ("masked_words", "masked_entities")  # logged as the step's totals
    if bool(config.single_cross_entropy):
        return GradAccumulation(lambda m: m["masked_words"] + m["masked_entities"], counts)
    return GradAccumulation(lambda m: m["masked_words"], counts)


def fused_table_update(config: ml_collections.ConfigDict,
                       num_entities: int) -> FusedTableUpdate | None:
    """The blockwise update of DocEnt-Dual's entity table when ``config.fused_table_update``
    is on (``None`` otherwise; ``docs/docent.md``): blocks of ``vocab_block_size`` rows,
    cosine logits, and the clip norm ``make_optimizer`` builds the optimizer with."""
    if not config.get("fused_table_update", False):
        return None
    return FusedTableUpdate(("entity_embeddings",), num_entities, int(config.vocab_block_size),
                            cosine=True, grad_clip_norm=float(config.grad_clip_norm) or None)


def build_task(config: ml_collections.ConfigDict, mesh: Mesh) -> Task:
    """The ``Task`` of ``config.variant``: pretrained encoder (a bad path fails before any
    data work), the entity data, the entity-sentence table in the variant's layout and,
    with ``eval_every``, held-out ranking."""
    pretrained = load_pretrained(config.model)
    limit = pretrained.config.max_position_embeddings - (
        pretrained.config.pad_token_id + 1 if pretrained.config.model_type == "roberta" else 0)
    if int(config.max_length) > limit:
        raise ValueError(f"config.max_length={config.max_length} exceeds the {limit} positions "
                         f"of {config.model}; pass --config.max_length={limit} or less")
    data, table = docent_data.training_data(config, pretrained.model_dir)
    model = build_model(config, pretrained.config, data.num_entities)
    tokenizer, batch = load_tokenizer(pretrained.model_dir), int(config.batch_size)
    variant = config.variant
    masking = masking_config(config, tokenizer) if variant != "dual" else None
    layout = docent_data.FullLayout.from_tokenizer(tokenizer) if variant == "full" else None
    steps_per_epoch = sharded_corpus.epoch_steps(table, batch)
    warmup = head_warmup_steps(config, configs.num_train_steps(config, steps_per_epoch))
    if warmup < int(config.mlm_warmup_steps) and config.mlm_head_init == "warmup" and \
            variant != "dual":
        logging.warning("head-only warm-up shortened from %d to %d steps (at most half of the "
                        "run)", int(config.mlm_warmup_steps), warmup)

    queries = eval_subset(data.queries, int(config.get("eval_examples", 0)))

    def evaluate(params, step):
        from docent_jax.evaluate import evaluate_ranker
        from docent_jax.inference import EntityRanker

        if not queries:
            return {}
        ranker = EntityRanker(model, params, tokenizer, config, data.entity_ids, step=step)
        return {f"heldout_{k}": v for k, v in evaluate_ranker(ranker, queries).items()}

    name = TASK_NAMES[variant] + (f" ({config.softmax} softmax)" if variant != "full" else "")
    return Task(
        name=name, init_params=init_fn(model),
        loss_fn=make_loss_fn(model, config, mesh, masking),
        make_batches=lambda start: docent_data.make_batches(
            table, config, start, process_index=jax.process_index(),
            process_count=jax.process_count(), full_layout=layout, warmup_steps=warmup),
        num_examples=table.num_examples,
        steps_per_epoch=steps_per_epoch,
        global_batch_size=batch, pretrained={PRETRAINED_PATH: pretrained.params},
        evaluate=evaluate if int(config.eval_every) > 0 else None,
        run_files={docent_data.ENTITY_IDS_FILE: lambda path: docent_data.keep_entity_ids(
            path, data.entity_ids), **encoder_run_files(pretrained.model_dir)},
        make_optimizer=make_optimizer,
        grad_accumulation=grad_accumulation(config),
        fused_table=fused_table_update(config, data.num_entities),
        summary=f"{data.num_entities} entities; {data.description}",
        logical_axis_sizes={"heads": pretrained.config.num_heads})


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
          *, stop_after: int | None = None) -> training.TrainState:
    """Trains (or resumes) ``config.variant`` into ``workdir`` (see ``embedding_core.run.run``).

    Writes ``run_config.json``, ``encoder/`` (HF config, tokenizer), ``entity_ids.txt``
    (line i = row i of the table), TensorBoard events and checkpoints (params, optimizer
    state, data position) under ``workdir``.

    Raises:
      ValueError: bad config (checked before compiling). FileNotFoundError: a model or data
      path that does not exist. data_pipelines.errors.DataError: malformed data.
    """
    return run(build_task, config, workdir, validate=validate_config, stop_after=stop_after)
