"""sentence-transformers' ``util.mine_hard_negatives`` (6.3) on the mesh: the same
arguments, candidates, filters and output rows, the top-k step by
``embedding_core.serving.search`` (``docs/search.md``, "Hard negatives")."""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from embedding_core.serving import search

FORMATS = ("triplet", "n-tuple", "labeled-pair", "labeled-list")
STRATEGIES = ("top", "random")
Encode = Callable[[list[str]], np.ndarray]  # texts -> [n, dim] float32


@dataclasses.dataclass
class Mined:
    """``rows`` of ``columns`` as sentence-transformers' dataset lists them (labeled-list:
    a list of texts and a list of 0/1 labels); ``skipped``: candidates each filter removed."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    skipped: dict[str, int]


def _check(num_negatives: int, range_min: int, range_max: int, output_format: str,
           sampling_strategy: str) -> None:
    if output_format not in FORMATS:
        raise ValueError(f"output_format {output_format!r}: use one of {FORMATS}")
    if sampling_strategy not in STRATEGIES:
        raise ValueError(f"sampling_strategy {sampling_strategy!r}: use one of {STRATEGIES}")
    if range_min < 0:
        raise ValueError(f"range_min must be non-negative, got range_min={range_min}")
    if range_min >= range_max:
        raise ValueError(f"range_min must be smaller than range_max, got range_min="
                         f"{range_min} and range_max={range_max}")
    if num_negatives > range_max - range_min:
        raise ValueError(f"cannot mine {num_negatives} negatives per query: only "
                         f"{range_max - range_min} candidates remain after skipping the first "
                         f"range_min={range_min} of range_max={range_max}")


def mine_hard_negatives(
        anchors: Sequence[str], positives: Sequence[str], encode_queries: Encode,
        encode_corpus: Encode, *, corpus: Sequence[str] | None = None, range_min: int = 0,
        range_max: int | None = None, max_score: float | None = None,
        min_score: float | None = None, absolute_margin: float | None = None,
        relative_margin: float | None = None, num_negatives: int = 3,
        sampling_strategy: str = "top", include_positives: bool = False,
        output_format: str = "triplet", names: tuple[str, str] = ("anchor", "positive"),
        seed: int | None = None, mesh: Mesh | None = None) -> Mined:
    """Hard negatives of ``(anchor, positive)`` pairs from ``corpus`` (default: the
    positives; positives are always added, the whole de-duplicated), scored by cosine of
    ``encode_queries(unique anchors)`` and ``encode_corpus(corpus)``. Arguments and defaults
    as sentence-transformers'; ``seed`` drives ``random`` sampling (numpy, so the draws differ
    from sentence-transformers' ``random.sample``). Raises ValueError: as sentence-transformers
    (bad ranges, ``num_negatives < 1``, no pairs, an unknown format or strategy)."""
    if len(anchors) != len(positives) or not anchors:
        raise ValueError(f"{len(anchors)} anchors and {len(positives)} positives: give as many, "
                         "at least one")
    if include_positives:
        if output_format != "n-tuple":
            logging.warning("include_positives=True: output_format set to 'n-tuple' to keep "
                            "the ranking order, as sentence-transformers does")
        output_format = "n-tuple"
    if num_negatives < 1:
        raise ValueError(f"num_negatives must be at least 1, got num_negatives={num_negatives}")
    max_positives = max(collections.Counter(anchors).values())
    if range_max is None:  # room for skipped candidates, as sentence-transformers
        extra = num_negatives * 10 if (absolute_margin is not None or relative_margin
                                       is not None or max_score is not None) else num_negatives
        range_max = range_min + extra + max_positives
    _check(num_negatives, range_min, range_max, output_format, sampling_strategy)

    queries = list(dict.fromkeys(anchors))
    texts = list(dict.fromkeys(list(positives if corpus is None else corpus) + list(positives)))
    corpus_idx = {t: i for i, t in enumerate(texts)}
    query_idx = {q: i for i, q in enumerate(queries)}
    own = np.array([corpus_idx.get(q, -1) for q in queries], np.int64)
    n_q = len(queries)
    c_emb = np.asarray(encode_corpus(texts), np.float32)
    q_emb = np.asarray(encode_queries(queries), np.float32)

    want = range_max + max_positives + 1
    scores, indices = search.search(q_emb, c_emb, min(want, len(texts)), score="cos",
                                    mesh=mesh)
    scores = np.pad(scores, ((0, 0), (0, want - scores.shape[1])), constant_values=-np.inf)
    indices = np.pad(indices, ((0, 0), (0, want - indices.shape[1])), constant_values=-1)

    positive_indices: list[list[int]] = [[] for _ in range(n_q)]
    for anchor, positive in zip(anchors, positives, strict=True):
        q = query_idx[anchor]
        if corpus_idx[positive] not in positive_indices[q]:
            positive_indices[q].append(corpus_idx[positive])
        if include_positives and anchor == positive:
            own[q] = -1
    n_pos = np.array([len(p) for p in positive_indices], np.int64)
    pos_query = np.repeat(np.arange(n_q), n_pos)
    pos_flat = np.array([i for row in positive_indices for i in row], np.int64)
    positive_scores = _pairwise_cos(q_emb[pos_query], c_emb[pos_flat])

    scores[indices == -1] = -np.inf
    scores[indices == own[:, None]] = -np.inf  # the anchor's own text in the corpus
    if not include_positives:
        stride = len(texts) + 1
        keys = np.sort(pos_query * stride + pos_flat + 1)
        cand = np.arange(n_q)[:, None] * stride + indices + 1
        where = np.minimum(np.searchsorted(keys, cand), len(keys) - 1)
        scores[keys[where] == cand] = -np.inf
    skipped = _filter(scores, positive_scores, n_pos, absolute_margin, relative_margin,
                      max_score, min_score)

    # lax.top_k-like: by score, then by search rank (the lower corpus row at equal scores).
    order = np.argsort(-scores, axis=1, kind="stable")[:, range_min:range_max]
    neg_s = np.take_along_axis(scores, order, axis=1)
    neg_i = np.take_along_axis(indices, order, axis=1)
    if sampling_strategy == "top":
        neg_s, neg_i = neg_s[:, :num_negatives], neg_i[:, :num_negatives]
    else:
        rng = np.random.default_rng(seed)
        options = np.maximum(neg_s.shape[1] - np.isinf(neg_s).sum(1), num_negatives)
        pick = np.stack([rng.choice(int(o), num_negatives, replace=False) for o in options])
        neg_s = np.take_along_axis(neg_s, pick, axis=1)
        neg_i = np.take_along_axis(neg_i, pick, axis=1)
        resort = np.argsort(-neg_s, axis=1, kind="stable")
        neg_s = np.take_along_axis(neg_s, resort, axis=1)
        neg_i = np.take_along_axis(neg_i, resort, axis=1)
    columns, rows = _rows(output_format, names, queries, texts, positive_indices, pos_query,
                          pos_flat, neg_s, neg_i)
    return Mined(columns, rows, skipped)


def _pairwise_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 ``[n]`` as sentence-transformers' ``pairwise_cos_sim`` (eps 1e-12)."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), np.float32(1e-12))
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), np.float32(1e-12))
    return np.sum(a * b, axis=1, dtype=np.float32)


def _filter(scores: np.ndarray, positive_scores: np.ndarray, n_pos: np.ndarray,
            absolute_margin: float | None, relative_margin: float | None,
            max_score: float | None, min_score: float | None) -> dict[str, int]:
    """Sets the candidates each rule removes to -inf in place, in sentence-transformers'
    order; float32 comparisons against the scalars, as torch makes them."""
    skipped = {}
    if absolute_margin is not None or relative_margin is not None:
        # The least positive score of the query (its hardest positive), as there.
        starts = np.concatenate([[0], np.cumsum(n_pos)[:-1]])
        least = np.minimum.reduceat(positive_scores, starts)[:, None]
        if absolute_margin is not None:
            removed = scores + np.float32(absolute_margin) > least
            scores[removed] = -np.inf
            skipped["absolute_margin"] = int(removed.sum())
        if relative_margin is not None:
            removed = scores > least - np.abs(least) * np.float32(relative_margin)
            scores[removed] = -np.inf
            skipped["relative_margin"] = int(removed.sum())
    if max_score is not None:
        removed = scores > np.float32(max_score)
        scores[removed] = -np.inf
        skipped["max_score"] = int(removed.sum())
    if min_score is not None:
        removed = (scores < np.float32(min_score)) & (scores != -np.inf)
        scores[removed] = -np.inf
        skipped["min_score"] = int(removed.sum())
    return skipped


def _rows(fmt: str, names: tuple[str, str], queries: list[str], texts: list[str],
          positive_indices: list[list[int]], pos_query: np.ndarray, pos_flat: np.ndarray,
          neg_s: np.ndarray, neg_i: np.ndarray) -> tuple[list[str], list[tuple[Any, ...]]]:
    """sentence-transformers' rows of each output format, in its order."""
    anchor, positive = names
    found = neg_s != -np.inf
    negatives = [[texts[j] for j, ok in zip(ni, fi, strict=True) if ok]
                 for ni, fi in zip(neg_i.tolist(), found.tolist(), strict=True)]
    pairs = list(zip(pos_query.tolist(), pos_flat.tolist(), strict=True))
    if fmt == "triplet":
        return [anchor, positive, "negative"], [
            (queries[q], texts[p], n) for q, p in pairs for n in negatives[q]]
    if fmt == "labeled-pair":
        rows = []
        for q, query in enumerate(queries):
            rows.extend((query, texts[p], 1) for p in positive_indices[q])
            rows.extend((query, n, 0) for n in negatives[q])
        return [anchor, positive, "label"], rows
    if fmt == "n-tuple":
        width = neg_s.shape[1]
        return [anchor, positive, *(f"negative_{i}" for i in range(1, width + 1))], [
            (queries[q], texts[p], *negatives[q]) for q, p in pairs if found[q].all()]
    return [anchor, positive, "labels"], [
        (queries[q], [texts[p], *negatives[q]], [1] + [0] * len(negatives[q]))
        for q, p in pairs if negatives[q]]
