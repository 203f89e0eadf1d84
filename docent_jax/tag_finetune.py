"""Fine-tuning a DocEnt model on MovieLens tags (*our choice*; ``docs/docent_tags.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from docent_jax.model import ENTITY_PARAMS
from docent_jax.tag_eval import check_disjoint


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """How the tag fine-tuning runs (the ``tag_*`` config fields)."""

    steps: int = 300  # optimizer steps per setting
    batch_size: int = 64  # tags per step (capped at the training tags)
    learning_rate: float = 3e-5  # AdamW: the encoder and every non-entity model parameter
    entity_learning_rate: float = 1e-3  # the entity table, entity biases and scale
    head_learning_rate: float = 1e-3  # the head's offsets and biases
    weight_decay: float = 0.0  # decoupled, on the encoder's matrices only
    seed: int = 0  # order of the tag minibatches
    progress: bool = False  # a tqdm bar over the steps

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, *,
                    progress: bool = False) -> FinetuneSettings:
        """The settings of a DocEnt config (entity rate: the run's ratio; 0: the encoder's)."""
        lr = float(config.tag_learning_rate)
        ratio = (float(config.entity_learning_rate) / float(config.learning_rate)
                 if float(config.entity_learning_rate) > 0 else 1.0)
        return cls(steps=int(config.tag_finetune_steps), batch_size=int(config.tag_batch_size),
                   learning_rate=lr, entity_learning_rate=lr * ratio,
                   head_learning_rate=float(config.tag_head_learning_rate),
                   weight_decay=float(config.get("weight_decay", 0.0)),
                   seed=int(config.get("split_seed", 0)), progress=progress)


@dataclasses.dataclass
class FinetuneResult:
    """One setting: ``scores`` ``[n_movies, n_tags]`` float32, ``zero_shot``, tuned ``params``
    and ``head`` (``offset [rows, dim]``, ``bias [rows]``), BCE before, after, step losses."""

    scores: np.ndarray
    zero_shot: np.ndarray
    params: Any
    head: dict[str, np.ndarray]
    loss_before: float
    loss_after: float
    step_losses: np.ndarray


class TagScorer:
    """A ranker's pure functions compiled once: tokens + offsets -> ``[batch, num_rows]`` logits."""

    def __init__(self, ranker, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.ranker = ranker
        self.batch_size = int(batch_size)
        self._inputs: dict[tuple[str, ...], dict[str, np.ndarray]] = {}
        self._step = None

        def raw(params, ids, mask, types, offsets):
            q = ranker.query_fn(params, ids, mask, types) + offsets
            return ranker.entity_scores_fn(params, q)

        self._raw = jax.jit(raw)

    @classmethod
    def for_ranker(cls, ranker, batch_size: int) -> TagScorer:
        """The scorer of ``ranker`` for ``batch_size``, kept on (and freed with) the ranker."""
        cache = ranker.__dict__.setdefault("_tag_scorers", {})
        if batch_size not in cache:
            cache[batch_size] = cls(ranker, batch_size)
        return cache[batch_size]

    def inputs(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``ranker.query_inputs(texts)``, cached: ``[n, L]`` int32 arrays."""
        key = tuple(texts)
        if key not in self._inputs:
            self._inputs[key] = {k: np.asarray(v, np.int32)
                                 for k, v in self.ranker.query_inputs(list(texts)).items()}
        return self._inputs[key]

    def raw_scores(self, params, texts: Sequence[str], offsets: np.ndarray,
                   columns: np.ndarray) -> np.ndarray:
        """Logits without bias ``[n, c]`` float32 of texts + ``offsets`` ``[n, dim]``."""
        inputs = self.inputs(texts)
        n, b = len(texts), self.batch_size
        offsets = np.asarray(offsets, np.float32)
        out = []
        for start in range(0, n, b):
            rows = np.arange(start, min(start + b, n))
            # Fixed batch shape (one compile): pad by repeating the first row.
            padded = np.concatenate([rows, np.full(b - len(rows), rows[0])])
            block = np.asarray(jax.device_get(self._raw(
                params, inputs["input_ids"][padded], inputs["attention_mask"][padded],
                inputs["token_type_ids"][padded], offsets[padded])))[:len(rows)]
            out.append(block[:, columns])
        return np.concatenate(out, axis=0).astype(np.float32)

    def step_fn(self):
        """The jitted training step, one for every setting (:func:`make_optimizer`)."""
        if self._step is None:
            self._step = _make_step(self.ranker, make_optimizer(FinetuneSettings()))
        return self._step


def _group(path, _leaf) -> str:
    keys = [getattr(k, "key", None) for k in path]
    if keys[0] == "head":
        return "head"
    return "entity" if keys[1] in ENTITY_PARAMS else "encoder"


def make_optimizer(settings: FinetuneSettings) -> optax.GradientTransformation:
    """AdamW per group (encoder, entity, head), injected rates: one compiled step for all."""
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))
    return optax.multi_transform(
        {"encoder": adamw(learning_rate=settings.learning_rate,
                          weight_decay=settings.weight_decay,
                          mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
         "entity": adamw(learning_rate=settings.entity_learning_rate, weight_decay=0.0),
         "head": adamw(learning_rate=settings.head_learning_rate, weight_decay=0.0)},
        lambda tree: jax.tree_util.tree_map_with_path(_group, tree))


def _placement(params) -> jax.sharding.Sharding:
    """Where new arrays go: replicated over the params' mesh (or their one device)."""
    sharding = jax.tree.leaves(params)[0].sharding
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding


def _pin(tree, place: jax.sharding.Sharding):
    """Commits leaves to ``place``: the step sees one sharding and compiles once."""

    def put(x):
        s = getattr(x, "sharding", None)
        if isinstance(place, NamedSharding) and isinstance(s, NamedSharding) \
                and s.mesh == place.mesh:
            return x
        return x if s == place else jax.device_put(x, place)

    return jax.tree.map(put, tree)


def _make_step(ranker, tx: optax.GradientTransformation):
    def loss_fn(trainable, ids, mask, types, head_index, columns, labels):
        params, head = trainable["model"], trainable["head"]
        q = ranker.query_fn(params, ids, mask, types) + head["offset"][head_index]
        logits = jnp.take(ranker.entity_scores_fn(params, q), columns, axis=1)
        logits = logits + head["bias"][head_index][:, None]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))

    def step(trainable, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(trainable, *batch)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    compiled = {}

    def call(trainable, opt_state, *batch):
        # Outputs keep the inputs' shardings, so the next step reuses the compiled program.
        shardings = jax.tree.map(lambda x: x.sharding, (trainable, opt_state))
        key = jax.tree.structure(shardings), tuple(jax.tree.leaves(shardings))
        if key not in compiled:
            compiled[key] = jax.jit(step, out_shardings=(*shardings, None))
        return compiled[key](trainable, opt_state, *batch)

    return call


def bce(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean sigmoid binary cross-entropy in float64 (numerically stable)."""
    x, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    return float(np.mean(np.logaddexp(0.0, x) - y * x))


def _calibrated_bias(raw: np.ndarray, labels: np.ndarray, head_index: np.ndarray,
                     rows: int) -> np.ndarray:
    """Per head row: log-odds of its (smoothed) positive rate minus its mean raw logit."""
    bias = np.zeros(rows, np.float32)
    for h in range(rows):
        members = head_index == h
        if not members.any():
            continue
        y = labels[members]
        p = (y.sum() + 0.5) / (y.size + 1.0)
        bias[h] = np.log(p / (1 - p)) - float(np.mean(raw[members], dtype=np.float64))
    return bias


def finetune(scorer: TagScorer, texts: Sequence[str], head_index: np.ndarray, head_rows: int,
             labels: np.ndarray, columns: np.ndarray, settings: FinetuneSettings,
             eval_texts: Sequence[str], eval_head_index: np.ndarray,
             eval_columns: np.ndarray, *, desc: str = "tag fine-tuning") -> FinetuneResult:
    """Fine-tunes ``scorer.ranker`` on ``texts`` (``head_index`` ``[n]``, ``labels`` ``[n, c]``)
    and scores the evaluation block; ValueError: shapes, no text, a head index out of range."""
    ranker = scorer.ranker
    labels = np.asarray(labels, bool)
    head_index = np.asarray(head_index, np.int32)
    eval_head_index = np.asarray(eval_head_index, np.int32)
    columns, eval_columns = (np.asarray(c, np.int32) for c in (columns, eval_columns))
    n = len(texts)
    if n == 0 or labels.shape != (n, len(columns)) or head_index.shape != (n,):
        raise ValueError(f"{n} texts, labels {labels.shape}, {len(columns)} columns and "
                         f"head_index {head_index.shape} do not agree")
    for name, idx in (("head_index", head_index), ("eval_head_index", eval_head_index)):
        if idx.size and (idx.min() < 0 or idx.max() >= head_rows):
            raise ValueError(f"{name} must lie in [0, {head_rows})")
    for cols in (columns, eval_columns):
        if cols.size and (cols.min() < 0 or cols.max() >= ranker.num_entities):
            raise ValueError(f"columns must be entity indices in [0, {ranker.num_entities})")
    dim = int(ranker.dim)
    raw_train = scorer.raw_scores(ranker.params, texts, np.zeros((n, dim), np.float32), columns)
    zero_shot = scorer.raw_scores(ranker.params, eval_texts,
                                  np.zeros((len(eval_texts), dim), np.float32), eval_columns)
    head = {"offset": jnp.zeros((head_rows, dim), jnp.float32),
            "bias": jnp.asarray(_calibrated_bias(raw_train, labels, head_index, head_rows))}
    loss_before = bce(raw_train + np.asarray(head["bias"])[head_index][:, None], labels)

    step = scorer.step_fn()
    # jax arrays are immutable and nothing is donated: the ranker's params stay as trained.
    place = _placement(ranker.params)
    trainable = _pin({"model": ranker.params, "head": head}, place)
    opt_state = _pin(make_optimizer(settings).init(trainable), place)
    inputs = scorer.inputs(texts)
    batch = min(settings.batch_size, n)
    order = _minibatches(n, batch, settings.steps, settings.seed)
    columns_dev, labels_f = jnp.asarray(columns), labels.astype(np.float32)
    losses = []
    with tqdm(total=settings.steps, desc=desc, unit="step", disable=not settings.progress) as bar:
        for s, rows in enumerate(order):
            trainable, opt_state, loss = step(
                trainable, opt_state, inputs["input_ids"][rows], inputs["attention_mask"][rows],
                inputs["token_type_ids"][rows], head_index[rows], columns_dev, labels_f[rows])
            losses.append(loss)
            bar.update(1)
            if settings.progress and (s % 10 == 0 or s == settings.steps - 1):
                bar.set_postfix(bce=f"{float(loss):.4f}")
    params = trainable["model"]
    head_np = {k: np.asarray(jax.device_get(v), np.float32) for k, v in trainable["head"].items()}

    def logits(texts, index, cols):
        raw = scorer.raw_scores(params, texts, head_np["offset"][index], cols)
        return raw + head_np["bias"][index][:, None]

    loss_after = bce(logits(texts, head_index, columns), labels)
    scores = logits(eval_texts, eval_head_index, eval_columns)
    return FinetuneResult(
        scores=scores.T.astype(np.float32), zero_shot=zero_shot.T.astype(np.float32),
        params=params, head=head_np, loss_before=loss_before, loss_after=loss_after,
        step_losses=np.asarray(jax.device_get(losses), np.float32).reshape(-1))


def _minibatches(n: int, batch: int, steps: int, seed: int) -> list[np.ndarray]:
    """``steps`` batches of distinct indices, one seeded permutation per epoch."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    while len(out) < steps:
        perm = rng.permutation(n)
        out.extend(perm[i:i + batch] for i in range(0, n - batch + 1, batch))
    return out[:steps]


def finetune_closed(scorer: TagScorer, tag_texts: Sequence[str], counts: np.ndarray,
                    entity_rows: np.ndarray, train_rows: np.ndarray, test_rows: np.ndarray, *,
                    train_threshold: int, settings: FinetuneSettings) -> FinetuneResult:
    """Closed vocabulary: every tag on ``train_rows``, a head row per tag; ValueError."""
    counts = np.asarray(counts)
    train_rows, test_rows = np.asarray(train_rows), np.asarray(test_rows)
    check_disjoint(train_rows, test_rows, "train_rows and test_rows", "movies")
    entity_rows = np.asarray(entity_rows)
    tags = np.arange(len(tag_texts))
    labels = (counts[train_rows] > train_threshold).T  # [n_tags, n_train]
    return finetune(scorer, list(tag_texts), tags, len(tag_texts), labels,
                    entity_rows[train_rows], settings, list(tag_texts), tags,
                    entity_rows[test_rows], desc="fine-tune, closed vocabulary")


def finetune_open(scorer: TagScorer, tag_texts: Sequence[str], counts: np.ndarray,
                  entity_rows: np.ndarray, train_tags: np.ndarray, test_tags: np.ndarray, *,
                  train_threshold: int, settings: FinetuneSettings) -> FinetuneResult:
    """Open vocabulary: ``train_tags`` on every movie, one shared head row; ValueError: overlap."""
    counts = np.asarray(counts)
    train_tags, test_tags = np.asarray(train_tags), np.asarray(test_tags)
    check_disjoint(train_tags, test_tags, "train_tags and test_tags", "tags")
    texts = [tag_texts[j] for j in train_tags]
    eval_texts = [tag_texts[j] for j in test_tags]
    labels = (counts[:, train_tags] > train_threshold).T  # [n_train_tags, n_movies]
    entity_rows = np.asarray(entity_rows)
    return finetune(scorer, texts, np.zeros(len(texts), np.int32), 1, labels, entity_rows,
                    settings, eval_texts, np.zeros(len(eval_texts), np.int32), entity_rows,
                    desc="fine-tune, open vocabulary")


__all__ = ["FinetuneResult", "FinetuneSettings", "TagScorer", "bce", "finetune",
           "finetune_closed", "finetune_open", "make_optimizer"]
