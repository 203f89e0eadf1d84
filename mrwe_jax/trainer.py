"""ConvRR / FCRR as a ``Task``: P x K batches, the batch-hard triplet loss (``docs/mrwe.md``)."""

from __future__ import annotations

import os

import jax
import ml_collections
from jax.sharding import Mesh

from data_pipelines.retrieval_corpus import RetrievalCorpus
from embedding_core import Task, run, write_json
from embedding_core.losses.contrastive import GradAccumulation, check_split
from embedding_core.training.training import TrainState
from mrwe_jax import data, evaluate
from mrwe_jax.configs.default import validate_config
from mrwe_jax.features.cache import FeatureSet, parse_list
from mrwe_jax.inference import FEATURES_FILE, IDF_FILE, Retriever
from mrwe_jax.loss import make_loss_fn
from mrwe_jax.model import build_model, init_fn, with_words


def build_task(config: ml_collections.ConfigDict, mesh: Mesh, *,
               corpus: RetrievalCorpus | None = None,
               features: FeatureSet | None = None) -> Task:
    """The task of ``config``; ``corpus``, ``features`` skip loading. ValueError (before data): P
    not divisible by data devices or processes, or P per device by ``grad_accum_steps``."""
    P, K = int(config.paragraphs_per_batch), int(config.questions_per_paragraph)
    data_size = mesh.shape["data"]
    if P % data_size or P % jax.process_count():
        # Both sides are sharded over "data": P paragraphs and P*K questions per batch.
        raise ValueError(
            f"config.paragraphs_per_batch={P} must be divisible by the data-parallel size "
            f"{data_size} and the process count {jax.process_count()} (mesh "
            f"{dict(mesh.shape)}); choose a multiple of {data_size}")
    steps = int(config.grad_accum_steps)
    if steps > 1:  # micro-batch j: each device's j-th block of paragraphs and questions
        check_split("grad_accum_steps", steps, P, mesh, chunk=False, what="paragraphs_per_batch")
    if corpus is None or features is None:
        corpus, features = data.load_data(config)
    batches = data.PKBatches(
        features, corpus.question_paragraph, corpus.train_questions, P=P, K=K,
        seed=int(config.seed), with_words=with_words(config), small_groups=config.small_groups,
        max_paragraph_words=int(config.max_paragraph_words),
        process_index=jax.process_index(), process_count=jax.process_count())
    model = build_model(config)
    retriever = Retriever(model, None, config, features)
    ks = parse_list(config.recall_ks, int)

    def evaluate_test_pool(params, step: int) -> dict[str, float]:
        def encode_rows(side, rows):
            return retriever.encode_features(features, side, rows, params=params)

        return evaluate.tower_recall(encode_rows, corpus, pool=config.eval_pool, ks=ks)

    return Task(
        name=config.tower, init_params=init_fn(model, features, config),
        loss_fn=make_loss_fn(model, config, features), make_batches=batches.iterator,
        num_examples=len(batches.train_q), steps_per_epoch=batches.steps_per_epoch,
        global_batch_size=P * (1 + K), evaluate=evaluate_test_pool,
        # Eval files: questions through the question tower, passages the paragraph one.
        encoder_of=lambda params, step: Retriever(model, params, config, features, step=step),
        batch_spec=data.BATCH[config.tower],
        # Batch-hard mining then looks within a micro-batch (docs/mrwe.md).
        grad_accumulation=GradAccumulation(),
        run_files={FEATURES_FILE: lambda path: write_json(path, features.recipe()),
                   IDF_FILE: lambda path: write_json(path, features.idf_table.to_json())},
        summary=f"P={P} x K={K}, d''={features.dim}; {corpus.summary()}")


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
          stop_after: int | None = None, corpus: RetrievalCorpus | None = None,
          features: FeatureSet | None = None) -> TrainState:
    """Trains (or resumes) into ``workdir`` (``features.json``, ``idf.json`` beside the run);
    ValueError (config), DataError (SQuAD), FileNotFoundError."""
    return run(lambda config, mesh: build_task(config, mesh, corpus=corpus, features=features),
               config, workdir, validate=validate_config, stop_after=stop_after)
