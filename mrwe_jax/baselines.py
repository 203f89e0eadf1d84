"""Lexical retrieval baselines: TF-IDF cosine (scikit-learn) and Okapi BM25 (``bm25s``).

Both return dense score matrices ``[n_questions, n_paragraphs]`` float32 (higher = more
relevant) for ``embedding_core.metrics`` recall@k. Both use the method's word tokenisation
(``data_pipelines.word_sources.tokenize_words``: lowercase ``\\w+``, no stop-word removal, no
stemming) unless another tokenizer is passed, so every system sees the same words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from data_pipelines.word_sources import tokenize_words

Tokenizer = Callable[[str], list[str]]


def tfidf_scores(
    questions: Sequence[str],
    paragraphs: Sequence[str],
    *,
    fit_on: str = "paragraphs",
    tokenizer: Tokenizer = tokenize_words,
    **vectorizer_kwargs: Any,
) -> np.ndarray:
    """Cosine similarity of TF-IDF vectors (``sklearn.feature_extraction.text.TfidfVectorizer``).

    Args:
      questions: n_q query texts.
      paragraphs: n_p candidate texts.
      fit_on: ``"paragraphs"`` (vocabulary and IDF from the knowledge base only) or
        ``"all"`` (paragraphs and questions, as the authors' code did).
      tokenizer: text -> words.
      **vectorizer_kwargs: passed to ``TfidfVectorizer`` (sklearn defaults otherwise:
        ``smooth_idf=True``, ``sublinear_tf=False``, ``norm="l2"``; the authors' code used
        ``smooth_idf=False, sublinear_tf=True``).

    Returns:
      ``[n_q, n_p]`` float32 cosine similarities (0 for a text with no known word).

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
    """Okapi BM25 scores from the ``bm25s`` package (Lu 2024).

    With ``method="lucene"`` (the package default) the score of paragraph d for query q is::

        sum_{t in q} ln(1 + (N - df_t + 0.5) / (df_t + 0.5))
                     * tf_{t,d} / (tf_{t,d} + k1 * (1 - b + b * |d| / avgdl))

    (Kamphuis et al. 2020); a query word repeated r times counts r times, and query words
    absent from every paragraph add nothing.

    Args:
      questions: n_q query texts.
      paragraphs: n_p candidate texts (the index).
      k1, b: BM25 parameters (package defaults 1.5 and 0.75).
      method: a ``bm25s`` variant: "robertson", "lucene", "atire", "bm25l", "bm25+".
      tokenizer: text -> words.

    Returns:
      ``[n_q, n_p]`` float32 scores (0 row for a query with no indexed word).

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
