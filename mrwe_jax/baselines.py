"""Lexical baselines: TF-IDF cosine (scikit-learn) and Okapi BM25 (``bm25s``), each a dense
``[n_questions, n_paragraphs]`` float32 score matrix (higher = more relevant), on the
method's words (``mrwe_jax.features.sources.tokenize_words``) unless told otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mrwe_jax.features.sources import tokenize_words

Tokenizer = Callable[[str], list[str]]


def tfidf_scores(
    questions: Sequence[str],
    paragraphs: Sequence[str],
    *,
    fit_on: str = "paragraphs",
    tokenizer: Tokenizer = tokenize_words,
    **vectorizer_kwargs: Any,
) -> np.ndarray:
    """``[n_q, n_p]`` float32 cosine of ``TfidfVectorizer`` rows (0 for no known word),
    fitted on ``"paragraphs"`` or ``"all"`` texts (the authors' code; it also used
    ``smooth_idf=False, sublinear_tf=True``: ``vectorizer_kwargs``).

    Raises:
      ValueError: unknown ``fit_on``; empty ``paragraphs``.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    if fit_on not in ("paragraphs", "all"):
        raise ValueError(f"fit_on must be 'paragraphs' or 'all', got {fit_on!r}")
    if not paragraphs:
        raise ValueError("tfidf_scores needs at least one paragraph")
    vectorizer = TfidfVectorizer(
        tokenizer=tokenizer, lowercase=False, token_pattern=None, **vectorizer_kwargs
    )
    vectorizer.fit(list(paragraphs) + (list(questions) if fit_on == "all" else []))
    q = vectorizer.transform(list(questions))
    p = vectorizer.transform(list(paragraphs))
    return cosine_similarity(q, p, dense_output=True).astype(np.float32)


def bm25_scores(
    questions: Sequence[str],
    paragraphs: Sequence[str],
    *,
    k1: float = 1.5,
    b: float = 0.75,
    method: str = "lucene",
    tokenizer: Tokenizer = tokenize_words,
) -> np.ndarray:
    """``[n_q, n_p]`` float32 Okapi BM25 scores (``bm25s``, ``method`` one of its
    variants; "lucene": ``sum_{t in q} ln(1 + (N - df_t + 0.5) / (df_t + 0.5)) tf_{t,d} /
    (tf_{t,d} + k1 (1 - b + b |d| / avgdl))``, Kamphuis et al. 2020; a repeated query word
    counts each time; 0 row for a query with no indexed word).

    Raises:
      ValueError: empty ``paragraphs`` or an unknown method (from ``bm25s``).
    """
    import bm25s

    if not paragraphs:
        raise ValueError("bm25_scores needs at least one paragraph")
    retriever = bm25s.BM25(k1=k1, b=b, method=method)
    retriever.index([tokenizer(p) for p in paragraphs], show_progress=False)
    out = np.zeros((len(questions), len(paragraphs)), np.float32)
    for i, question in enumerate(questions):
        ids = retriever.get_tokens_ids(tokenizer(question))
        if ids:
            out[i] = retriever.get_scores_from_ids(ids)
    return out
