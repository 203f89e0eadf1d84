"""Lexical baselines, TF-IDF cosine and Okapi BM25: dense ``[n_questions, n_paragraphs]`` float32
scores on the method's words (``features.sources.tokenize_words``) unless told."""

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
    """``[n_q, n_p]`` float32 cosine of ``TfidfVectorizer`` rows fitted on ``"paragraphs"`` or
    ``"all"`` (``vectorizer_kwargs``: the authors' ``smooth_idf=False, sublinear_tf=True``);
    ValueError: unknown ``fit_on``, no paragraphs."""
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
    """``[n_q, n_p]`` float32 BM25 (``bm25s`` ``method``; "lucene": ``sum_{t in q} ln(1 + (N -
    df_t + 0.5) / (df_t + 0.5)) tf / (tf + k1 (1 - b + b |d| / avgdl))``, Kamphuis et al.
    2020); ValueError: no paragraphs, an unknown method."""
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
