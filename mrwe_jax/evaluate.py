"""Recall@k of the right paragraph for each test question, the comparison table and t-SNE.

Protocol (Cakaloglu & Xu, arXiv 1902.00663, sec. 4; recall@k as in Manning et al. 2008):
for each test question, all paragraphs of the pool are ranked by cosine similarity (the
towers' outputs are unit vectors, so this is also the Euclidean order the triplet loss
trains); ``recall@k`` is the share of questions whose paragraph is among the first k.
Ties are pessimistic (``embedding_core.metrics.ranks_of_targets``: every other paragraph
scoring at least as high counts ahead), so rank k counts and rank k+1 does not.

Pools: ``"test"``: all paragraphs of the test articles (article split: unseen in training);
``"all"``: every paragraph of the corpus (the paper's "all paragraphs"; with the article
split the training paragraphs are extra distractors). With the seen-paragraph split both
pools are every paragraph.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from embedding_core.metrics import ranks_of_targets, recall_at_k_from_ranks
from mrwe_jax import data
from mrwe_jax.model import SiameseRetriever

SOURCE_LABELS = {
    "glove": "GloVe 6B 50d (context-free)",
    "contextual": "MiniLM hidden states (contextual)",
    "tfidf": "hashed TF-IDF words (statistical)",
}


# --------------------------------------------------------------------------- ranking


def pool_indices(corpus: data.RetrievalCorpus, pool: str) -> np.ndarray:
    """``[n_pool]`` int64 paragraph indices of the retrieval pool (``"test"`` or ``"all"``)."""
    if pool == "test":
        return np.flatnonzero(corpus.test_pool)
    if pool == "all":
        return np.arange(len(corpus.paragraph_ids))
    raise ValueError(f"pool must be 'test' or 'all', got {pool!r}")


def targets_in_pool(question_paragraph: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Column of each question's paragraph in the pool.

    Args:
      question_paragraph: ``[n_q]`` int paragraph index of each evaluated question.
      pool: ``[n_pool]`` int paragraph indices, no repeats.

    Returns:
      ``[n_q]`` int64 positions into ``pool``.

    Raises:
      ValueError: a question's paragraph is not in the pool, or the pool repeats one.
    """
    pool = np.asarray(pool, np.int64)
    if len(np.unique(pool)) != len(pool):
        raise ValueError("the paragraph pool repeats a paragraph")
    position = {int(p): i for i, p in enumerate(pool)}
    missing = [int(p) for p in question_paragraph if int(p) not in position]
    if missing:
        raise ValueError(f"{len(missing)} questions have their paragraph outside the pool "
                         f"(first: paragraph {missing[0]})")
    return np.array([position[int(p)] for p in question_paragraph], np.int64)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(norm > 0, x / np.where(norm > 0, norm, 1.0), 0.0).astype(np.float32)


def cosine_ranks(question_vectors: np.ndarray, pool_vectors: np.ndarray, targets: np.ndarray,
                 *, block: int = 1024) -> np.ndarray:
    """1-based pessimistic rank of each question's target among the pool, by cosine.

    A zero vector (a text without words) has cosine 0 to everything, so its target ties
    with every paragraph and gets the worst rank.

    Args:
      question_vectors: ``[n_q, d]`` float.
      pool_vectors: ``[n_pool, d]`` float.
      targets: ``[n_q]`` int columns into the pool.
      block: questions scored at a time (bounds the ``[block, n_pool]`` score matrix).

    Returns:
      ``[n_q]`` int64 ranks in ``[1, n_pool]``.
    """
    q, p = _unit(question_vectors), _unit(pool_vectors)
    targets = np.asarray(targets)
    ranks = [ranks_of_targets(q[s:s + block] @ p.T, targets[s:s + block])
             for s in range(0, len(q), block)]
    return np.concatenate(ranks) if ranks else np.zeros((0,), np.int64)


def score_ranks(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Ranks from a precomputed ``[n_q, n_pool]`` score matrix (lexical baselines)."""
    return ranks_of_targets(scores, targets)


# --------------------------------------------------------------------------- encoding


def _encoder(model: SiameseRetriever, config: ml_collections.ConfigDict,
             features: data.FeatureSet, is_question: bool):
    from mrwe_jax.trainer import text_batch, with_words

    words = with_words(config)
    names, u = list(features.names), np.asarray(features.source_weights)

    @jax.jit
    def run(params, arrays):
        tb = text_batch(arrays, "x_", names, u, features.source_aggregate,
                        features.word_aggregate, words)
        return model.apply({"params": params}, tb, is_question,
                           method=SiameseRetriever.encode)

    return run


def encode_side(model: SiameseRetriever, params: Any, config: ml_collections.ConfigDict,
                features: data.FeatureSet, side: str, indices: np.ndarray | None = None, *,
                batch_size: int | None = None, progress: bool = False) -> np.ndarray:
    """Tower outputs of the questions or paragraphs ``indices`` (default all).

    Texts go shortest first in fixed-size batches (padded with empty rows) with word
    widths rounded up to powers of two, so few shapes compile; rows come back in the order
    of ``indices``.

    Returns:
      ``[len(indices), d'']`` float32 unit vectors (zero for a text with no word when the
      tower is skipped, e.g. paragraphs with ``question_only``).
    """
    from mrwe_jax.trainer import with_words

    feats = features.side(side)
    n = len(feats[features.names[0]].offsets) - 1
    indices = np.arange(n) if indices is None else np.asarray(indices, np.int64)
    batch_size = int(batch_size or config.eval_batch_size)
    run = _encoder(model, config, features, side == "questions")
    lengths = features.lengths(side)[indices]
    order = np.argsort(lengths, kind="stable")
    out = np.zeros((len(indices), features.dim), np.float32)
    starts = range(0, len(indices), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"encode {side}", unit="batch", leave=False)
    for start in starts:
        rows = order[start:start + batch_size]
        idx = indices[rows]
        pad = batch_size - len(idx)
        arrays = data.side_arrays(features, side, idx, with_words=with_words(config),
                                  prefix="x_")
        if pad:
            arrays = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                      for k, v in arrays.items()}
        out[rows] = np.asarray(run(params, arrays))[: len(idx)]
    return out


@dataclasses.dataclass
class TrainedTower:
    """A restored ConvRR/FCRR run: its model, params, config and checkpoint step."""

    name: str
    model: SiameseRetriever
    params: Any
    config: ml_collections.ConfigDict
    step: int
    workdir: str = ""

    def encode(self, features: data.FeatureSet, side: str, indices: np.ndarray | None = None,
               *, progress: bool = False) -> np.ndarray:
        """See :func:`encode_side`."""
        return encode_side(self.model, self.params, self.config, features, side, indices,
                           progress=progress)


def tower_label(config: ml_collections.ConfigDict, step: int) -> str:
    """Row label, e.g. ``"ensemble + ConvRR (step 300)"``."""
    name = {"convrr": "ConvRR", "fcrr": "FCRR"}[config.tower]
    extra = ", question side only" if config.question_only else ""
    return f"ensemble + {name} (step {step}{extra})"


def load_tower(workdir: str | os.PathLike, features: data.FeatureSet, *,
               step: int | None = None) -> TrainedTower:
    """Restores a training workdir (see ``mrwe_jax.trainer.restore``)."""
    from mrwe_jax import trainer

    config = trainer.read_config(workdir)
    model, params, step = trainer.restore(workdir, config, features, step=step)
    return TrainedTower(tower_label(config, step), model, params, config, step, str(workdir))


# --------------------------------------------------------------------------- the table


def evaluate_retrieval(
    corpus: data.RetrievalCorpus,
    features: data.FeatureSet,
    towers: Sequence[TrainedTower] = (),
    *,
    pool: str = "test",
    ks: Sequence[int] = (1, 2, 3, 5, 10, 20, 50),
    lexical: bool = True,
    ensemble_variants: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, dict[int, float]]:
    """Recall@k of every system on the test questions, one row per system.

    Rows, in order: TF-IDF and BM25 (``mrwe_jax.baselines``, fitted on the pool's
    paragraphs), each single source's text vectors, the multi-resolution ensemble (with
    the features' ``u``, then with each of ``ensemble_variants``, ``config.source_weights``
    values such as ``"balanced"``), then each trained tower (which uses the features' ``u``).

    Returns:
      ``{row label: {k: recall in [0, 1]}}``.
    """
    from mrwe_jax import baselines

    q_idx = np.flatnonzero(corpus.test_questions)
    p_idx = pool_indices(corpus, pool)
    targets = targets_in_pool(corpus.question_paragraph[q_idx], p_idx)
    rows: dict[str, dict[int, float]] = {}

    def add(label: str, ranks: np.ndarray) -> None:
        rows[label] = recall_at_k_from_ranks(ranks, ks)

    if lexical:
        q_texts = [corpus.question_texts[i] for i in q_idx]
        p_texts = [corpus.paragraph_texts[i] for i in p_idx]
        add("TF-IDF (lexical, sklearn)",
            score_ranks(baselines.tfidf_scores(q_texts, p_texts), targets))
        add("BM25 (lexical, bm25s)", score_ranks(baselines.bm25_scores(q_texts, p_texts),
                                                 targets))
    for name in features.names:
        add(SOURCE_LABELS.get(name, name),
            cosine_ranks(features.questions[name].vectors[q_idx],
                         features.paragraphs[name].vectors[p_idx], targets))
    if len(features.names) > 1:
        add(f"multi-resolution ensemble ({'+'.join(features.names)})",
            cosine_ranks(data.ensemble_vectors(features, "questions", indices=q_idx),
                         data.ensemble_vectors(features, "paragraphs", indices=p_idx),
                         targets))
        for variant in ensemble_variants:
            u = data.resolve_source_weights(
                variant, features.names, {n: features.paragraphs[n].vectors
                                          for n in features.names})
            other = dataclasses.replace(features, source_weights=u)
            add(f"multi-resolution ensemble, u={variant} ("
                + ", ".join(f"{x:.3f}" for x in u) + ")",
                cosine_ranks(data.ensemble_vectors(other, "questions", indices=q_idx),
                             data.ensemble_vectors(other, "paragraphs", indices=p_idx),
                             targets))
    for tower in towers:
        add(tower.name, cosine_ranks(tower.encode(features, "questions", q_idx,
                                                  progress=progress),
                                     tower.encode(features, "paragraphs", p_idx,
                                                  progress=progress), targets))
    return rows


def format_table(rows: Mapping[str, Mapping[int, float]], title: str = "") -> str:
    """Fixed-width text table of recall@k in percent, one system per line."""
    ks = list(next(iter(rows.values())).keys()) if rows else []
    width = max([len("system")] + [len(r) for r in rows])
    head = f"{'system':<{width}} | " + " ".join(f"{'R@' + str(k):>6}" for k in ks)
    lines = ([title] if title else []) + [head, "-" * len(head)]
    for label, recall in rows.items():
        lines.append(f"{label:<{width}} | "
                     + " ".join(f"{100 * recall[k]:6.2f}" for k in ks))
    return "\n".join(lines)


# --------------------------------------------------------------------------- t-SNE


def tsne_selection(corpus: data.RetrievalCorpus, num_paragraphs: int) -> tuple[np.ndarray,
                                                                                np.ndarray]:
    """Test questions of the ``num_paragraphs`` test paragraphs with the most questions.

    Ties in question count go to the earlier paragraph.

    Returns:
      ``(question indices [m] int64, their paragraph indices [m] int64)``.
    """
    q_idx = np.flatnonzero(corpus.test_questions)
    paragraphs, counts = np.unique(corpus.question_paragraph[q_idx], return_counts=True)
    order = np.lexsort((paragraphs, -counts))[:num_paragraphs]
    chosen = set(paragraphs[order].tolist())
    sel = np.array([i for i in q_idx if int(corpus.question_paragraph[i]) in chosen], np.int64)
    return sel, corpus.question_paragraph[sel]


def plot_tsne(panels: Sequence[tuple[str, np.ndarray]], labels: np.ndarray,
              path: str | os.PathLike, *, seed: int = 0, title: str = "") -> Path:
    """t-SNE (van der Maaten & Hinton 2008; ``sklearn.manifold.TSNE``) of each panel's vectors.

    Vectors are unit-normalised first (Euclidean distance then orders like cosine). One
    colour per label (paragraph). Written atomically as PNG (matplotlib, Agg backend).

    Args:
      panels: ``[(title, [m, d] float vectors)]``, same rows in each.
      labels: ``[m]`` int paragraph of each row.
      path: output ``.png``.

    Returns:
      The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    labels = np.asarray(labels)
    m = len(labels)
    if m < 3:
        raise ValueError(f"t-SNE needs at least 3 points, got {m}")
    palette = plt.get_cmap("tab20")
    classes = {c: i for i, c in enumerate(dict.fromkeys(labels.tolist()))}
    colours = [palette(classes[c] % 20) for c in labels.tolist()]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5.5), squeeze=False)
    for ax, (name, vectors) in zip(axes[0], panels, strict=True):
        points = TSNE(n_components=2, perplexity=min(30.0, (m - 1) / 3), init="pca",
                      random_state=seed).fit_transform(_unit(vectors))
        ax.scatter(points[:, 0], points[:, 1], c=colours, s=18)
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path


def tsne_before_after(corpus: data.RetrievalCorpus, features: data.FeatureSet,
                      tower: TrainedTower, path: str | os.PathLike, *,
                      num_paragraphs: int = 15) -> Path:
    """t-SNE of test questions (coloured by paragraph): ensemble vs the trained tower."""
    sel, labels = tsne_selection(corpus, num_paragraphs)
    before = data.ensemble_vectors(features, "questions", indices=sel)
    after = tower.encode(features, "questions", sel)
    return plot_tsne(
        [("multi-resolution ensemble (before)", before), (f"{tower.name} (after)", after)],
        labels, path,
        title=f"test questions of the {len(set(labels.tolist()))} test paragraphs with most "
              "questions, coloured by paragraph")


# --------------------------------------------------------------------------- loading


class Retriever:
    """A trained workdir ready to embed: its corpus, features and tower.

    Attributes:
      corpus, features: as the run was trained (features from the on-disk cache).
      tower: the restored :class:`TrainedTower`.
    """

    def __init__(self, workdir: str | os.PathLike, *, step: int | None = None) -> None:
        from mrwe_jax import trainer

        self.config = trainer.read_config(workdir)
        self.corpus, self.features = trainer.load_data(self.config)
        self.tower = load_tower(workdir, self.features, step=step)
        self._sources: dict[str, Any] = {}

    def encode(self, texts: Sequence[str], *, side: str = "questions") -> np.ndarray:
        """Embeds new texts with the run's sources, IDF table and tower.

        Args:
          texts: strings (a text without words gets the zero vector, or the tower's output
            of a zero input).
          side: ``"questions"`` or ``"paragraphs"`` (differs only with ``question_only``).

        Returns:
          ``[len(texts), d'']`` float32.
        """
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, not a single string")
        specs = data.source_specs(self.config)
        feats = {}
        for spec in specs:
            if spec.name not in self._sources:
                self._sources[spec.name] = spec.build()
            feats[spec.name] = data.compute_text_features(
                list(texts), self._sources[spec.name], self.features.idf_table,
                layer_weights=spec.layer_weights, layer_aggregate=self.config.layer_aggregate,
                word_aggregate=self.config.word_aggregate)
        new = dataclasses.replace(self.features, questions=feats, paragraphs=feats)
        return self.tower.encode(new, side)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> Retriever:
    """See :class:`Retriever`."""
    return Retriever(workdir, step=step)
