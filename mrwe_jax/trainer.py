"""``train(config, workdir)``: ConvRR / FCRR with the batch-hard triplet loss, shared loop.

The Siamese set-up of Cakaloglu & Xu (arXiv 1902.00663, sec. 3.2, Figure 3): questions
(anchors) and paragraphs (candidates) go through one tower; for each question the hardest
positive is its paragraph (the only one with its label in the batch) and the hardest
negative the nearest other paragraph of the batch (Hermans et al. 2017, eq. 5, via
``embedding_core.losses.batch_hard_triplet_loss``). Negatives are the P - 1 other paragraphs
of the *global* batch (the loss is written on the global batch; XLA inserts the
collectives).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from embedding_core import parallel, training
from embedding_core.export import write_json
from embedding_core.losses import batch_hard_triplet_loss
from mrwe_jax import data
from mrwe_jax.embeddings import ensemble_sources, pool_words
from mrwe_jax.model import FCRR, ConvRR, SiameseRetriever, TextBatch

CONFIG_FILE = "config.json"
FEATURES_FILE = "features.json"
TOWERS = ("convrr", "fcrr")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible settings before anything is loaded or compiled.

    Raises:
      ValueError: naming the field.
    """
    choices = {
        "tower": TOWERS, "split": data.SPLITS, "eval_pool": ("test", "all"),
        "layer_aggregate": ("sum", "average", "concatenate"),
        "source_aggregate": ("sum", "average", "concatenate"),
        "word_aggregate": ("sum", "average"), "distance": ("euclidean", "squared", "cosine"),
        "small_groups": ("replace", "skip"), "lr_decay": ("constant", "linear", "cosine"),
    }
    for name, allowed in choices.items():
        if config[name] not in allowed:
            raise ValueError(f"config.{name}={config[name]!r}: use one of {allowed}")
    for name in ("paragraphs_per_batch", "questions_per_paragraph", "num_blocks",
                 "window_size", "fcrr_hidden", "eval_batch_size"):
        if int(config[name]) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    if config.margin < 0:
        raise ValueError(f"config.margin must be >= 0, got {config.margin}")
    if not 0.0 <= config.dropout_rate < 1.0:
        raise ValueError(f"config.dropout_rate must be in [0, 1), got {config.dropout_rate}")
    if config.dropout_rate and config.tower != "fcrr":
        raise ValueError("config.dropout_rate applies to FCRR only (ConvRR has no dropout)")
    data.parse_list(config.recall_ks, int)


def with_words(config: ml_collections.ConfigDict) -> bool:
    """ConvRR reads the word matrices; FCRR only the text vectors."""
    return config.tower == "convrr"


def build_model(config: ml_collections.ConfigDict) -> SiameseRetriever:
    """The Siamese retriever with the configured tower."""
    if config.tower == "convrr":
        tower = ConvRR(num_blocks=int(config.num_blocks), window_size=int(config.window_size),
                       kernels=int(config.kernels) or None, scale=float(config.scale))
    else:
        tower = FCRR(num_blocks=int(config.num_blocks), hidden=int(config.fcrr_hidden),
                     scale=float(config.scale), dropout_rate=float(config.dropout_rate))
    return SiameseRetriever(tower=tower, question_only=bool(config.question_only))


def text_batch(
    batch: Mapping[str, jax.Array], prefix: str, names: Sequence[str], source_weights: Any,
    source_aggregate: str, word_aggregate: str, words: bool,
) -> TextBatch:
    """One side of a batch as the tower's input: the multi-resolution ensemble on device.

    ``f_ensemble`` (``mrwe_jax.embeddings.ensemble_sources``) of the per-source mixtures;
    with ``words`` the word matrices ``[b, L, d'']`` are ensembled and pooled over the real
    words into the text vector, else the pooled per-source vectors ``[b, d_j]`` are.

    Args:
      batch: ``{prefix + name: [b, L, d_j] or [b, d_j], prefix + "mask": [b, L] bool}``.
      prefix: ``"q_"`` or ``"p_"``.
      source_weights: ``[n_sources]`` ``u``.

    Returns:
      :class:`mrwe_jax.model.TextBatch` (float32).
    """
    u = jnp.asarray(source_weights, jnp.float32)
    parts = [batch[prefix + n] for n in names]
    mixed = ensemble_sources(parts, u, source_aggregate)
    if not words:
        return TextBatch(text=mixed)
    mask = batch[prefix + "mask"]
    return TextBatch(text=pool_words(mixed, mask, word_aggregate), words=mixed, mask=mask)


def encode_batch(model: SiameseRetriever, params: Any, batch: Mapping[str, jax.Array],
                 config: ml_collections.ConfigDict, names: Sequence[str], source_weights: Any,
                 *, deterministic: bool = True, rng: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array]:
    """``(questions [b_q, d''], paragraphs [b_p, d''])`` float32 unit vectors of a batch."""
    sides = [text_batch(batch, p, names, source_weights, config.source_aggregate,
                        config.word_aggregate, with_words(config)) for p in ("q_", "p_")]
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": params}, *sides, deterministic=deterministic, rngs=rngs)


def make_loss_fn(model: SiameseRetriever, config: ml_collections.ConfigDict,
                 names: Sequence[str], source_weights: Any):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch.

    Rows: the ``P*K`` questions (anchors only) and the ``P`` paragraphs (candidates only),
    labelled by paragraph index. Metrics: the triplet statistics (``active_fraction``,
    ``mean_d_ap``, ``mean_d_an``: both near 0 with loss near the margin is collapse) and
    ``batch_top1``, the share of questions whose own paragraph is the nearest of the batch.
    """
    deterministic = not float(config.dropout_rate)

    def loss_fn(params, batch, rng):
        q, p = encode_batch(model, params, batch, config, names, source_weights,
                            deterministic=deterministic, rng=rng)
        n_q, n_p = q.shape[0], p.shape[0]
        embeddings = jnp.concatenate([q, p], axis=0)
        labels = jnp.concatenate([batch["q_label"], batch["p_label"]]).astype(jnp.int32)
        is_question = jnp.arange(n_q + n_p) < n_q
        loss, stats = batch_hard_triplet_loss(
            embeddings, labels, margin=float(config.margin), soft_margin=bool(config.soft_margin),
            distance=config.distance, anchors=is_question, candidates=~is_question)
        sims = jnp.einsum("qd,pd->qp", q, p, precision=jax.lax.Precision.HIGHEST)
        own = batch["q_label"][:, None] == batch["p_label"][None, :]
        own_score = jnp.max(jnp.where(own, sims, -jnp.inf), axis=1)
        other_best = jnp.max(jnp.where(own, -jnp.inf, sims), axis=1)
        stats = dict(stats)
        stats["batch_top1"] = jnp.mean((own_score > other_best).astype(jnp.float32))
        return loss, stats

    return loss_fn


def example_batch(features: data.FeatureSet, config: ml_collections.ConfigDict,
                  rows: int = 1, width: int = 8) -> dict[str, np.ndarray]:
    """Zero inputs of the right widths (parameter shapes do not depend on rows or width)."""
    out: dict[str, np.ndarray] = {}
    for prefix in ("q_", "p_"):
        for n in features.names:
            dim = features.questions[n].dim
            shape = (rows, width, dim) if with_words(config) else (rows, dim)
            out[prefix + n] = np.zeros(shape, np.float32)
        if with_words(config):
            out[prefix + "mask"] = np.ones((rows, width), bool)
    return out


def init_fn(model: SiameseRetriever, features: data.FeatureSet,
            config: ml_collections.ConfigDict):
    """``rng -> params`` (boxed with logical axis names) for ``create_sharded_state``."""
    example = example_batch(features, config)
    sides = [text_batch(example, p, features.names, features.source_weights,
                        config.source_aggregate, config.word_aggregate, with_words(config))
             for p in ("q_", "p_")]

    def init(rng):
        return model.init(rng, *sides)["params"]

    return init


def make_tx(config: ml_collections.ConfigDict, total_steps: int):
    """AdamW with decoupled weight decay on the kernels (``embedding_core.training``)."""
    return training.make_optimizer(
        learning_rate=float(config.learning_rate), total_steps=max(int(total_steps), 1),
        warmup_steps=int(config.warmup_steps), weight_decay=float(config.weight_decay),
        decay=config.lr_decay, grad_clip_norm=float(config.grad_clip_norm) or None)


def num_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
    """``num_train_steps`` when positive, else ``ceil(num_epochs * steps_per_epoch)``."""
    if config.num_train_steps > 0:
        return int(config.num_train_steps)
    return max(1, math.ceil(steps_per_epoch * float(config.num_epochs)))


def load_data(config: ml_collections.ConfigDict, *, use_cache: bool = True
              ) -> tuple[data.RetrievalCorpus, data.FeatureSet]:
    """The corpus and its features as ``config`` describes them (features cached on disk)."""
    corpus = data.load_corpus(config.squad_path or None, split=config.split,
                              test_fraction=float(config.test_fraction),
                              seed=int(config.split_seed),
                              skip_invalid=bool(config.skip_invalid))
    logging.info("mrwe: %s", corpus.summary())
    if any(dataclasses.astuple(corpus.skips)):
        logging.warning("mrwe: skipped invalid SQuAD records: %s", corpus.skips)
    features = data.build_features(config, corpus, use_cache=use_cache)
    return corpus, features


def setup(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
          corpus: data.RetrievalCorpus | None = None,
          features: data.FeatureSet | None = None) -> dict[str, Any]:
    """Everything ``train`` needs, without running a step (also used by tests).

    ``corpus`` and ``features`` may be passed to skip loading (tests, the demo).
    """
    validate_config(config)
    training.check_workdir(workdir)
    mesh = parallel.mesh_from_config(config)
    P, K = int(config.paragraphs_per_batch), int(config.questions_per_paragraph)
    data_size = mesh.shape["data"]
    if P % data_size or P % jax.process_count():
        # Both sides are sharded over "data": P paragraphs and P*K questions per batch.
        raise ValueError(
            f"config.paragraphs_per_batch={P} must be divisible by the data-parallel size "
            f"{data_size} and the process count {jax.process_count()} (mesh "
            f"{dict(mesh.shape)}); choose a multiple of {data_size}")
    if corpus is None or features is None:
        corpus, features = load_data(config)
    batches = data.PKBatches(
        features, corpus.question_paragraph, corpus.train_questions, P=P, K=K,
        seed=int(config.seed), with_words=with_words(config), small_groups=config.small_groups,
        max_paragraph_words=int(config.max_paragraph_words),
        process_index=jax.process_index(), process_count=jax.process_count())
    steps = num_steps(config, batches.steps_per_epoch)
    model = build_model(config)
    tx, schedule = make_tx(config, steps)
    init_rng, dropout_rng = jax.random.split(jax.random.key(int(config.seed)))
    state, shardings = training.create_sharded_state(
        init_fn(model, features, config), tx, mesh, init_rng)
    loss_fn = make_loss_fn(model, config, features.names, features.source_weights)
    step_fn = training.make_train_step(loss_fn, shardings, mesh, schedule=schedule)
    return dict(mesh=mesh, corpus=corpus, features=features, batches=batches, model=model,
                tx=tx, state=state, shardings=shardings, step_fn=step_fn, loss_fn=loss_fn,
                dropout_rng=dropout_rng, num_steps=steps, workdir=Path(workdir))


def save_config(config: ml_collections.ConfigDict, workdir: Path,
                features: data.FeatureSet) -> None:
    """``config.json`` and ``features.json`` (source names, widths, resolved ``u``)."""
    if jax.process_index() != 0:
        return
    write_json(workdir / CONFIG_FILE, config.to_dict())
    write_json(workdir / FEATURES_FILE, {
        "sources": features.names,
        "source_dims": {n: features.questions[n].dim for n in features.names},
        "source_weights": [float(x) for x in features.source_weights],
        "source_aggregate": features.source_aggregate,
        "word_aggregate": features.word_aggregate,
        "dim": features.dim,
    })


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
          stop_after: int | None = None, corpus: data.RetrievalCorpus | None = None,
          features: data.FeatureSet | None = None) -> training.TrainState:
    """Trains (or resumes) ConvRR / FCRR on the training questions into ``workdir``.

    Writes ``workdir/config.json``, ``features.json``, TensorBoard events and orbax
    checkpoints under ``workdir/checkpoints`` (with the data position: a killed run resumes
    with the same batches). Usable from a notebook: nothing here parses flags.

    Raises:
      ValueError: bad config (checked before compiling).
      data_pipelines.errors.DataError: malformed SQuAD input (file and record).
      FileNotFoundError: a missing data file or model package.
    """
    s = setup(config, workdir, corpus=corpus, features=features)
    save_config(config, s["workdir"], s["features"])
    logging.info("training %s for %d steps (%d per epoch), P=%d x K=%d, d''=%d, mesh %s",
                 config.tower, s["num_steps"], s["batches"].steps_per_epoch,
                 config.paragraphs_per_batch, config.questions_per_paragraph,
                 s["features"].dim, dict(s["mesh"].shape))
    global_rows = int(config.paragraphs_per_batch) * (1 + int(config.questions_per_paragraph))
    return training.train_loop(
        workdir=s["workdir"], state=s["state"], state_shardings=s["shardings"],
        train_step=s["step_fn"], make_batches=s["batches"].iterator, mesh=s["mesh"],
        num_train_steps=s["num_steps"], rng=s["dropout_rng"], seed=int(config.seed),
        global_batch_size=global_rows, log_every=int(config.log_every),
        checkpoint_every=int(config.checkpoint_every),
        keep_checkpoints=int(config.keep_checkpoints), hparams=config.to_dict(),
        stop_after=stop_after)


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The ``config.json`` of a training workdir.

    Raises:
      FileNotFoundError: not a mrwe-jax workdir.
    """
    path = Path(workdir) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {workdir} a mrwe-jax training workdir?")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def restore(workdir: str | os.PathLike, config: ml_collections.ConfigDict,
            features: data.FeatureSet, *, step: int | None = None
            ) -> tuple[SiameseRetriever, Any, int]:
    """``(model, params, step)`` of a workdir's checkpoint, on a mesh of all devices."""
    model = build_model(config)
    tx, _ = make_tx(config, 10)
    mesh = parallel.make_mesh(-1, int(config.mesh_model))
    step, params = training.restore_params(
        Path(workdir) / "checkpoints", init_fn(model, features, config), tx, mesh, step=step)
    return model, params, step


