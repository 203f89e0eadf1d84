"""Recall@k of each test question's paragraph over a pool, the table and t-SNE."""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from etils import epath

from data_pipelines.retrieval_corpus import RetrievalCorpus
from embedding_core import multihost
from embedding_core.evaluation.metrics import ranks_of_targets, recall_at_k_from_ranks
from embedding_core.storage import storage
from embedding_core.storage.files import write_bytes_atomic
from mrwe_jax import baselines, data
from mrwe_jax.data import pool_indices
from mrwe_jax.features.cache import FeatureSet, resolve_source_weights
from mrwe_jax.inference import Retriever

# (side "questions" | "paragraphs", row indices) -> [n, d] vectors of those rows.
EncodeRows = Callable[[str, np.ndarray], np.ndarray]

SOURCE_LABELS = {
    "glove": "GloVe 6B 50d (context-free)",
    "contextual": "MiniLM hidden states (contextual)",
    "tfidf": "hashed TF-IDF words (statistical)",
}


def targets_in_pool(question_paragraph: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``[n_q]`` int64 pool column of each question's paragraph; ValueError: missing or repeated."""
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
                 *, block: int = 1024, split: bool = True) -> np.ndarray:
    """``[n_q]`` int64 pessimistic cosine ranks of ``targets`` in the pool (``split``: a
    collective)."""
    q, p = _unit(question_vectors), _unit(pool_vectors)
    targets = np.asarray(targets)

    def rows(first: int, last: int) -> np.ndarray:
        ranks = [ranks_of_targets(q[s:min(s + block, last)] @ p.T, targets[s:min(s + block,
                                                                                   last)])
                 for s in range(first, last, block)]
        return np.concatenate(ranks).astype(np.int64) if ranks else np.zeros((0,), np.int64)

    return multihost.split_map(rows, len(q), what="ranking") if split else rows(0, len(q))


def score_ranks(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Ranks from a precomputed ``[n_q, n_pool]`` score matrix (lexical baselines)."""
    return ranks_of_targets(scores, targets)


def evaluate_retrieval(
    corpus: RetrievalCorpus,
    features: FeatureSet,
    towers: Sequence[Retriever] = (),
    *,
    pool: str = "all",
    ks: Sequence[int] = (1, 2, 3, 5, 10, 20, 50),
    lexical: bool = True,
    ensemble_variants: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, dict[int, float]]:
    """``{row label: {k: recall}}``: TF-IDF, BM25, sources, ensembles, towers."""
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
        add("BM25 (lexical, bm25s)", score_ranks(baselines.bm25_scores(q_texts, p_texts), targets))
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
            u = resolve_source_weights(variant, features.names,
                                       {n: features.paragraphs[n].vectors
                                        for n in features.names})
            other = dataclasses.replace(features, source_weights=u)
            add(f"multi-resolution ensemble, u={variant} ("
                + ", ".join(f"{x:.3f}" for x in u) + ")",
                cosine_ranks(data.ensemble_vectors(other, "questions", indices=q_idx),
                             data.ensemble_vectors(other, "paragraphs", indices=p_idx),
                             targets))
    for tower in towers:
        add(tower.name, tower_ranks(
            lambda side, rows, tower=tower: tower.encode_features(
                features, side, rows, show_progress_bar=progress), corpus, pool,
            split=multihost.is_local(tower.params)))
    return rows


def tower_ranks(encode_rows: EncodeRows, corpus: RetrievalCorpus, pool: str = "all", *,
                split: bool = False) -> np.ndarray:
    """``[n_test_questions]`` ranks among the pool; ``split``: each process a slice."""
    q_idx = np.flatnonzero(corpus.test_questions)
    p_idx = pool_indices(corpus, pool)
    targets = targets_in_pool(corpus.question_paragraph[q_idx], p_idx)

    def encode(side: str, rows: np.ndarray) -> np.ndarray:
        if not split:
            return encode_rows(side, rows)
        return multihost.split_map(lambda a, b: encode_rows(side, rows[a:b]), len(rows),
                                   what=f"encode {side}")

    # Ranking is numpy on every process's full vectors: always split, whatever the encoder.
    return cosine_ranks(encode("questions", q_idx), encode("paragraphs", p_idx), targets)


def tower_recall(encode_rows: EncodeRows, corpus: RetrievalCorpus, *, pool: str = "all",
                 ks: Sequence[int] = (1, 2, 3, 5, 10, 20, 50)) -> dict[str, float]:
    """``{"<pool>_recall@k": recall}`` of a tower (the training loop's evaluation)."""
    recall = recall_at_k_from_ranks(tower_ranks(encode_rows, corpus, pool), ks)
    return {f"{pool}_recall@{k}": float(v) for k, v in recall.items()}


def format_table(rows: Mapping[str, Mapping[int, float]], title: str = "") -> str:
    """Fixed-width text table of recall@k in percent, one system per line."""
    ks = list(next(iter(rows.values())).keys()) if rows else []
    width = max([len("system")] + [len(r) for r in rows])
    head = f"{'system':<{width}} | " + " ".join(f"{'R@' + str(k):>6}" for k in ks)
    lines = ([title] if title else []) + [head, "-" * len(head)]
    for label, recall in rows.items():
        lines.append(f"{label:<{width}} | " + " ".join(f"{100 * recall[k]:6.2f}" for k in ks))
    return "\n".join(lines)


def tsne_selection(corpus: RetrievalCorpus, num_paragraphs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(questions, paragraphs)`` int64 of the test paragraphs with the most questions."""
    q_idx = np.flatnonzero(corpus.test_questions)
    paragraphs, counts = np.unique(corpus.question_paragraph[q_idx], return_counts=True)
    order = np.lexsort((paragraphs, -counts))[:num_paragraphs]
    chosen = set(paragraphs[order].tolist())
    sel = np.array([i for i in q_idx if int(corpus.question_paragraph[i]) in chosen], np.int64)
    return sel, corpus.question_paragraph[sel]


def plot_tsne(panels: Sequence[tuple[str, np.ndarray]], labels: np.ndarray,
              path: str | os.PathLike, *, seed: int = 0, title: str = "") -> epath.Path:
    """t-SNE of each panel's ``[m, d]`` unit vectors, a colour per label, a PNG at ``path``."""
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
    path = storage.as_path(path)
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=110)
    finally:
        plt.close(fig)
    write_bytes_atomic(path, png.getvalue())  # local or gs://, never half a picture
    return path


def tsne_before_after(corpus: RetrievalCorpus, features: FeatureSet,
                      tower: Retriever, path: str | os.PathLike, *,
                      num_paragraphs: int = 15) -> epath.Path:
    """t-SNE of test questions (coloured by paragraph): ensemble vs the trained tower."""
    sel, labels = tsne_selection(corpus, num_paragraphs)
    before = data.ensemble_vectors(features, "questions", indices=sel)
    after = tower.encode_features(features, "questions", sel)
    return plot_tsne(
        [("multi-resolution ensemble (before)", before), (f"{tower.name} (after)", after)],
        labels, path,
        title=f"test questions of the {len(set(labels.tolist()))} test paragraphs with most "
              "questions, coloured by paragraph")
