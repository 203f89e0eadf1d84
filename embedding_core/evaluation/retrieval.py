"""sentence-transformers' ``InformationRetrievalEvaluator`` over a chunked corpus with a
running top-k, graded NDCG and ties that never favour the model (``docs/evaluation.md``,
"Retrieval")."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from embedding_core.distributed import multihost
from embedding_core.errors import DataError, json_object
from embedding_core.storage.storage import as_path

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
Relevant = Mapping[str, set[str] | Mapping[str, int]]
_LOW28 = np.uint64((1 << 28) - 1)
_TOP_GRADE = 15  # grades above it tie with it in the tie-break (4 bits of the key)
_BLOCK = 1 << 24  # score-matrix entries per block: bounds the memory of one chunk's ranking


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 ``[n, m]`` cosines of ``[n, d]`` and ``[m, d]``; a zero row scores 0."""
    # Dividing after the matmul keeps integer inputs exact (no order-dependent rounding).
    norms = [np.maximum(np.linalg.norm(np.asarray(x, np.float64), axis=1), 1e-12) for x in (a, b)]
    return dot(a, b) / norms[0][:, None] / norms[1][None, :]


def dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 ``[n, m]`` dot products of ``[n, d]`` and ``[m, d]``."""
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64).T


SCORE_FUNCTIONS: dict[str, ScoreFn] = {"cosine": cosine, "dot": dot}


def _keys(scores: np.ndarray, grades: np.ndarray, start: int) -> np.ndarray:
    """uint64 keys sorting by (-score, grade, index): the float32 score's ordered bits (top
    32), ``15 - min(grade, 15)`` (bits 28-31), ``2**28 - 1 - index`` (low 28); never 0."""
    bits = (scores + np.float32(0)).view(np.uint32)  # + 0 turns -0.0 into +0.0: they tie
    ordered = np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))
    index = np.arange(start, start + scores.shape[1], dtype=np.uint64)
    worse = _TOP_GRADE - np.minimum(grades, _TOP_GRADE).astype(np.uint64)
    return ((ordered.astype(np.uint64) << np.uint64(32)) | (worse << np.uint64(28))
            | (_LOW28 - index))


def _decode(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Corpus indices (int64) and float32 scores of :func:`_keys` keys."""
    index = (_LOW28 - (keys & _LOW28)).astype(np.int64)
    ordered = (keys >> np.uint64(32)).astype(np.uint32)
    bits = np.where(ordered >> np.uint32(31), ordered & np.uint32(0x7FFFFFFF), ~ordered)
    return index, bits.view(np.float32)


def _top(keys: np.ndarray, k: int) -> np.ndarray:
    """The ``min(k, columns)`` largest keys of each row, largest first."""
    if keys.shape[1] > k:
        keys = np.take_along_axis(keys, np.argpartition(keys, -k, axis=1)[:, -k:], axis=1)
    return np.sort(keys, axis=1)[:, ::-1]


class InformationRetrievalEvaluator:
    """``relevant_docs``: ``{query id: {doc ids}}`` or ``{query id: {doc id: grade}}``. With
    ``g_i`` the grade at rank i, ``r_i = g_i >= 1``, R relevant, ``g*`` the ideal grades:
    precision = sum(r) / k, recall = sum(r) / R, MRR = 1 / (first relevant rank),
    NDCG = sum(g_i / log2(i + 1)) / sum_{i <= min(R, k)} g*_i / log2(i + 1) (pytrec_eval's),
    MAP = sum_i r_i * precision@i / min(R, k). Each process ranks its corpus rows.

    Raises ValueError: no query with relevant documents, no corpus or one of 2**28 - 1
    documents or more, a cutoff < 1, no ``ndcg_at_k``, an unknown score function.
    """

    def __init__(
        self,
        queries: Mapping[str, str],
        corpus: Mapping[str, str],
        relevant_docs: Relevant,
        *,
        name: str = "",
        batch_size: int = 32,
        accuracy_at_k: Sequence[int] = (1, 3, 5, 10),
        precision_recall_at_k: Sequence[int] = (1, 3, 5, 10),
        mrr_at_k: Sequence[int] = (10,),
        ndcg_at_k: Sequence[int] = (10,),
        map_at_k: Sequence[int] = (100,),
        score_functions: Sequence[str] | Mapping[str, ScoreFn] = ("cosine", "dot"),
        main_score_function: str | None = None,
        corpus_chunk_size: int = 50_000,
        show_progress_bar: bool = False,
    ) -> None:
        graded = {q: _grades(relevant_docs.get(q) or ()) for q in queries}
        self.query_ids = [q for q in queries if graded[q]]
        self.dropped_queries = len(queries) - len(self.query_ids)
        self.queries = [queries[q] for q in self.query_ids]
        self.relevant_docs: dict[str, dict[str, int]] = {q: graded[q] for q in self.query_ids}
        self.corpus_ids = list(corpus)
        self.corpus = [corpus[c] for c in self.corpus_ids]
        if len(self.corpus) >= int(_LOW28):
            raise ValueError(f"retrieval ranks up to {int(_LOW28) - 1} documents, got "
                             f"{len(self.corpus)}")
        row = {c: i for i, c in enumerate(self.corpus_ids)}
        # (corpus row, query row, grade) of every relevant pair in the corpus, by corpus row.
        self._pairs = np.array(sorted((row[c], q, g) for q, qid in enumerate(self.query_ids)
                                      for c, g in self.relevant_docs[qid].items() if c in row),
                               np.int64).reshape(-1, 3)
        if not self.query_ids or not self.corpus:
            raise ValueError(f"retrieval needs queries with relevant documents and a corpus; "
                             f"got {len(self.query_ids)} queries ({self.dropped_queries} "
                             f"without relevant documents) and {len(self.corpus)} documents")
        self.cutoffs = {m: _dedup(ks) for m, ks in (
            ("accuracy", accuracy_at_k), ("precision_recall", precision_recall_at_k),
            ("mrr", mrr_at_k), ("ndcg", ndcg_at_k), ("map", map_at_k))}
        if not self.cutoffs["ndcg"]:
            raise ValueError("ndcg_at_k must name a cutoff (the primary metric)")
        self.max_k = max(k for ks in self.cutoffs.values() for k in ks)
        self.score_functions = dict(score_functions) if isinstance(score_functions, Mapping) \
            else {f: SCORE_FUNCTIONS.get(f) for f in score_functions}
        if not self.score_functions or not all(map(callable, self.score_functions.values())):
            raise ValueError(f"score_functions {list(score_functions)}: names in "
                             f"{sorted(SCORE_FUNCTIONS)} or a {{name: function}} mapping")
        if main_score_function is not None and main_score_function not in self.score_functions:
            raise ValueError(f"main_score_function {main_score_function!r} is not one of "
                             f"{list(self.score_functions)}")
        self.name, self.batch_size = name, batch_size
        self.corpus_chunk_size = max(1, int(corpus_chunk_size))
        self.show_progress_bar = show_progress_bar
        self.primary_metric: str | None = None if main_score_function is None else \
            self._prefix(f"{main_score_function}_ndcg@{max(self.cutoffs['ndcg'])}")

    @classmethod
    def from_beir(cls, folder: str | os.PathLike, split: str = "test",
                  **kwargs: Any) -> InformationRetrievalEvaluator:
        """On a BEIR folder (:func:`read_beir`)."""
        return cls(*read_beir(folder, split), **kwargs)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, **kwargs: Any) -> InformationRetrievalEvaluator:
        """On a query/positive JSONL file (:func:`read_jsonl`)."""
        return cls(*read_jsonl(path), **kwargs)

    def _prefix(self, metric: str) -> str:
        return f"{self.name}_{metric}" if self.name else metric

    def __call__(self, encoder: Any) -> dict[str, float]:
        ranked = self.retrieve(encoder)
        per_fn = {f: self.compute_metrics(index) for f, (index, _) in ranked.items()}
        if self.primary_metric is None:
            k = max(self.cutoffs["ndcg"])
            # max() keeps the first of equal values: sorted names, as sentence-transformers.
            best = max(sorted(per_fn), key=lambda f: per_fn[f][f"ndcg@{k}"])
            self.primary_metric = self._prefix(f"{best}_ndcg@{k}")
        return {self._prefix(f"{f}_{m}"): v for f, ms in per_fn.items() for m, v in ms.items()}

    def retrieve(self, encoder: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per score function: int64 corpus indices and float32 scores ``[n_queries, k]``,
        best first. Raises ValueError: embeddings of the wrong shape, non-finite scores."""
        # Params spanning processes encode collectively: every process does it all.
        local = multihost.is_local(getattr(encoder, "params", None))
        encode_query = getattr(encoder, "encode_query", None) or encoder.encode
        n_q, n_docs = len(self.queries), len(self.corpus)
        q_emb = multihost.split_map(lambda a, b: self._encode(encode_query, self.queries[a:b]),
                                    n_q, what="retrieval queries") if local else \
            self._encode(encode_query, self.queries)
        logging.info("retrieval %s: %d queries (%d dropped), %d documents", self.name or "-",
                     n_q, self.dropped_queries, n_docs)
        count = jax.process_count() if local else 1

        def one(i: int, _: int) -> dict[str, np.ndarray]:
            part = self.search_rows(encoder, q_emb, *multihost.process_rows(n_docs, i, count))
            # The same [1, n_q, max_k] on every process (0 = no candidate) for the gather.
            return {f: np.pad(k, ((0, 0), (0, self.max_k - k.shape[1])))[None]
                    for f, k in part.items()}

        gathered = multihost.split_map(one, count, what="retrieval corpus")
        keys = {f: _top(np.concatenate(list(g), axis=1), self.max_k) for f, g in gathered.items()}
        k = min(self.max_k, n_docs)  # the zero padding sorts last
        return {f: _decode(v[:, :k]) for f, v in keys.items()}

    def _encode(self, fn: Callable[..., Any], texts: Sequence[str]) -> np.ndarray:
        out = np.asarray(fn(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                            show_progress_bar=self.show_progress_bar), dtype=np.float32)
        if out.ndim != 2 or len(out) != len(texts):
            raise ValueError(f"the encoder returned shape {out.shape} for {len(texts)} texts")
        return out

    def search_rows(self, encoder: Any, q_emb: np.ndarray, start: int,
                    stop: int) -> dict[str, np.ndarray]:
        """Per score function, the :func:`_keys` of each query's best corpus rows in
        ``[start, stop)``, best first (no collective: merge ranges with :func:`_top`)."""
        encode_doc = getattr(encoder, "encode_document", None) or encoder.encode
        best = {f: np.zeros((len(q_emb), 0), np.uint64) for f in self.score_functions}
        for a in range(start, stop, self.corpus_chunk_size):
            b = min(a + self.corpus_chunk_size, stop)
            docs = self._encode(encode_doc, self.corpus[a:b])
            rows = max(1, _BLOCK // (b - a))
            for f, fn in self.score_functions.items():
                blocks = []
                for q in range(0, len(q_emb), rows):
                    # float64 rounded to float32: the same whatever the chunk's shape.
                    scores = np.asarray(fn(q_emb[q:q + rows], docs), dtype=np.float32)
                    if scores.shape != (min(rows, len(q_emb) - q), b - a):
                        raise ValueError(f"score function {f!r} gave shape {scores.shape}")
                    if not np.isfinite(scores).all():  # NaN has no place in a ranking
                        raise ValueError(f"non-finite {f} scores for documents [{a}, {b})")
                    grades = self._relevance(q, q + len(scores), a, b)
                    blocks.append(_top(_keys(scores, grades, a), self.max_k))
                best[f] = _top(np.concatenate([best[f], np.concatenate(blocks)], axis=1),
                               self.max_k)
        return best

    def _relevance(self, q0: int, q1: int, a: int, b: int) -> np.ndarray:
        """int64 ``[q1 - q0, b - a]`` grades of corpus rows ``a:b`` for queries ``q0:q1``."""
        lo, hi = np.searchsorted(self._pairs[:, 0], [a, b])
        doc, query, grade = self._pairs[lo:hi].T
        keep = (query >= q0) & (query < q1)
        out = np.zeros((q1 - q0, b - a), np.int64)
        out[query[keep] - q0, doc[keep] - a] = grade[keep]
        return out

    def compute_metrics(self, index: np.ndarray) -> dict[str, float]:
        """The metrics (``accuracy@1``, ...) of ranked corpus indices ``[n_queries, k]``."""
        gain, best = (np.zeros((len(index), self.max_k)) for _ in range(2))
        for i, (qid, row) in enumerate(zip(self.query_ids, index, strict=True)):
            grades = self.relevant_docs[qid]
            gain[i, :len(row)] = [grades.get(self.corpus_ids[j], 0) for j in row]
            ideal_order = sorted(grades.values(), reverse=True)[:self.max_k]
            best[i, :len(ideal_order)] = ideal_order
        rel = gain > 0
        n_rel = np.array([len(self.relevant_docs[q]) for q in self.query_ids], np.float64)
        rank = np.arange(1, self.max_k + 1)
        hits = np.cumsum(rel, axis=1)  # relevant documents in the top i
        first = np.argmax(rel, axis=1) + 1
        discount = 1.0 / np.log2(rank + 1)
        ks, out = self.cutoffs, {}
        for k in ks["accuracy"]:
            out[f"accuracy@{k}"] = float(np.mean(hits[:, k - 1] > 0))
        for k in ks["precision_recall"]:
            out[f"precision@{k}"] = float(np.mean(hits[:, k - 1] / k))
        for k in ks["precision_recall"]:
            out[f"recall@{k}"] = float(np.mean(hits[:, k - 1] / n_rel))
        for k in ks["ndcg"]:
            dcg = (gain[:, :k] * discount[:k]).sum(axis=1)
            out[f"ndcg@{k}"] = float(np.mean(dcg / (best[:, :k] * discount[:k]).sum(axis=1)))
        for k in ks["mrr"]:
            out[f"mrr@{k}"] = float(np.mean(np.where(hits[:, k - 1] > 0, 1.0 / first, 0.0)))
        for k in ks["map"]:
            precision_sum = (rel[:, :k] * hits[:, :k] / rank[:k]).sum(axis=1)
            out[f"map@{k}"] = float(np.mean(precision_sum / np.minimum(n_rel, k)))
        return out


def _grades(docs: set[str] | Mapping[str, int]) -> dict[str, int]:
    if isinstance(docs, Mapping):
        return {c: int(g) for c, g in docs.items() if int(g) > 0}
    return dict.fromkeys(docs, 1)


def _dedup(ks: Sequence[int]) -> list[int]:
    if any(int(k) < 1 for k in ks):
        raise ValueError(f"cutoffs must be >= 1, got {list(ks)}")
    return list(dict.fromkeys(int(k) for k in ks))


def _records(path: Any, *, jsonl: bool = True) -> Iterator[tuple[int, Any]]:
    """(1-based line, parsed JSON or text) of the non-blank lines."""
    with path.open("rb") as f:
        for line, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8").removeprefix("\ufeff" if line == 1 else "")
            except UnicodeDecodeError as err:
                raise DataError(path, line, None, f"invalid UTF-8: {err.reason}") from None
            if not text.strip() or not jsonl:
                if text.strip():
                    yield line, text.rstrip("\r\n")
                continue
            yield line, json_object(path, line, text)


def _text(record: dict, field: str, path: Any, line: int, *, many: bool = False,
          optional: bool = False, blank: bool = False) -> Any:
    """``record[field]``, a string (``many``: or a list of them)."""
    if field not in record:
        if optional:
            return [] if many else ""
        raise DataError(path, line, field, "missing field")
    value = record[field]
    items = value if many and isinstance(value, list) else [value]
    if not all(isinstance(t, str) for t in items) or not (items or optional) or (
            many and optional and items is not value):
        raise DataError(path, line, field, f"expected {'a list of strings or ' if many else ''}"
                        f"a string, got {json.dumps(value)[:80]}")
    if not blank and any(not t.strip() for t in items):
        raise DataError(path, line, field, "empty text")  # encoders reject it, without a line
    return items if many else value


def _ids(path: Any, text_of: Callable[[dict, int], str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for line, record in _records(path):
        key = record.get("_id")
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)  # some BEIR exports write numeric ids
        if not isinstance(key, str) or not key:
            raise DataError(path, line, "_id", "missing field" if "_id" not in record else
                            f"expected a non-empty string, got {json.dumps(key)[:80]}")
        if key in texts:
            raise DataError(path, line, "_id", f"duplicate id {key!r}")
        texts[key] = text_of(record, line)
    return texts


def _grade(score: str) -> int | None:
    """A qrels grade: an integer, also written ``1.0`` as pair files take it; else None."""
    try:
        return int(score)
    except ValueError:
        pass
    try:
        value = float(score)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def read_beir(folder: str | os.PathLike, split: str = "test"
              ) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """``(queries, corpus, {query id: {doc id: grade}})`` of a BEIR folder
    (``docs/evaluation.md``, "BEIR layout").
    Raises: FileNotFoundError; DataError: invalid UTF-8 or JSON, a missing, mistyped or empty
    field, a duplicate id, a bad qrels row or header, an unknown id, a pair scored twice."""
    root = as_path(folder)
    paths = {name: root / f"{name}.jsonl" for name in ("corpus", "queries")}
    qrels_path = root / "qrels" / f"{split}.tsv"
    for path in (*paths.values(), qrels_path):  # one line naming what a BEIR folder lacks
        if not path.is_file():
            have = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) \
                if (root / "qrels").is_dir() else []
            raise FileNotFoundError(
                f"{root} is not a BEIR folder with split {split!r}: no "
                f"{path.relative_to(root)}" + (f" (qrels splits there: {have})" if have
                                               and path == qrels_path else ""))

    def document(record: dict, line: int) -> str:
        doc = (_text(record, "title", paths["corpus"], line, optional=True, blank=True) + " "
               + _text(record, "text", paths["corpus"], line, blank=True)).strip()
        if not doc:  # encoders reject it, without saying where it came from
            raise DataError(paths["corpus"], line, "text", "empty text and title")
        return doc

    corpus = _ids(paths["corpus"], document)
    queries = _ids(paths["queries"], lambda r, line: _text(r, "text", paths["queries"], line))
    return queries, corpus, read_qrels(qrels_path, queries, corpus)


def read_qrels(path: str | os.PathLike, queries: Collection[str], corpus: Collection[str]
               ) -> dict[str, dict[str, int]]:
    """BEIR ``qrels/*.tsv`` (header ``query-id corpus-id score``) as ``{query: {doc:
    grade}}``, grades > 0 kept. Raises DataError naming the line: a bad header or row, an
    id not in ``queries`` / ``corpus``, a grade out of range, a pair scored twice."""
    qrels_path = as_path(path)
    relevant: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    rows = _records(qrels_path, jsonl=False)
    header = next(rows, None)
    if header is None or header[1].split("\t") != ["query-id", "corpus-id", "score"]:
        raise DataError(qrels_path, header and header[0], None,
                        "expected the header 'query-id<TAB>corpus-id<TAB>score'")
    for line, text in rows:
        fields = text.split("\t")
        if len(fields) != 3:
            raise DataError(qrels_path, line, None, f"{len(fields)} tab-separated fields, not 3")
        qid, cid, score = fields
        if qid not in queries:
            raise DataError(qrels_path, line, "query-id", f"unknown query id {qid!r}")
        if cid not in corpus:
            raise DataError(qrels_path, line, "corpus-id", f"unknown corpus id {cid!r}")
        value = _grade(score)
        if value is None:
            raise DataError(qrels_path, line, "score", f"not an integer: {score!r}")
        if not -2**31 <= value < 2**31:
            raise DataError(qrels_path, line, "score", f"{score.strip()} is out of range (a "
                            "grade is a small integer: 0 or below not relevant, 1, 2, ...)")
        if seen.setdefault((qid, cid), value) != value:
            raise DataError(qrels_path, line, "score", f"{qid!r} and {cid!r} were given score "
                            f"{seen[qid, cid]} on an earlier line, now {value}")
        if value > 0:
            relevant.setdefault(qid, {})[cid] = value
    return relevant


def read_jsonl(path: str | os.PathLike
               ) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """``(queries, corpus, relevant_docs)`` of ``{"query", "positive": str | [str],
    "negatives"?: [str]}`` lines: one query per distinct text (id: its first line), the
    corpus every distinct text (id: itself). Raises DataError."""
    path = as_path(path)
    queries: dict[str, str] = {}
    corpus: dict[str, str] = {}
    relevant: dict[str, set[str]] = {}
    qid_of: dict[str, str] = {}
    for line, record in _records(path):
        query = _text(record, "query", path, line)
        positives = _text(record, "positive", path, line, many=True)
        negatives = _text(record, "negatives", path, line, many=True, optional=True)
        qid = qid_of.setdefault(query, str(line))
        queries[qid] = query
        relevant.setdefault(qid, set()).update(positives)
        for text in positives + negatives:
            corpus.setdefault(text, text)
    return queries, corpus, relevant
