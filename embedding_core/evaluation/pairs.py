"""sentence-transformers' STS, pair-classification and triplet evaluators, same numbers and
names (``docs/evaluation.md``): ``evaluator(encoder) -> dict[str, float]``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from scipy import stats
from sklearn.metrics import average_precision_score, matthews_corrcoef

from embedding_core.errors import DataError
from embedding_core.evaluation.pair_files import read_columns

SIMILARITY_FNS = ("cosine", "dot", "euclidean", "manhattan")
_DISTANCES = ("euclidean", "manhattan")  # scored as negative distances: greater is similar


class TextEncoder(Protocol):
    """What the evaluators call: ``SentenceTransformer.encode``'s form."""

    def encode(self, sentences: list[str], *, batch_size: int, show_progress_bar: bool,
               convert_to_numpy: bool) -> np.ndarray: ...


def pairwise_similarity(a: np.ndarray, b: np.ndarray, fn: str) -> np.ndarray:
    """float64 ``[n]`` similarity of rows i of ``[n, d]`` ``a`` and ``b``: cosine (eps 1e-12,
    torch's normalize), dot, ``-|a - b|_2`` or ``-|a - b|_1``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if fn == "cosine":
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return np.einsum("nd,nd->n", a, b)
    if fn == "dot":
        return np.einsum("nd,nd->n", a, b)
    if fn == "euclidean":
        return -np.linalg.norm(a - b, axis=1)
    if fn == "manhattan":
        return -np.abs(a - b).sum(axis=1)
    raise ValueError(f"unknown similarity function {fn!r}; expected one of {SIMILARITY_FNS}")


def embed(encoder: TextEncoder, texts: Sequence[str], *, batch_size: int,
          show_progress_bar: bool = False, method: str = "encode") -> np.ndarray:
    """float32 ``[len(texts), d]``, each distinct text encoded once, in first-seen order, by
    ``encoder.method`` where it exists (else ``encode``)."""
    unique = list(dict.fromkeys(texts))
    encode = getattr(encoder, method, encoder.encode)
    vectors = np.asarray(encode(unique, batch_size=batch_size,
                                show_progress_bar=show_progress_bar, convert_to_numpy=True))
    if vectors.ndim != 2 or len(vectors) != len(unique):
        raise ValueError(f"the encoder returned shape {vectors.shape} for {len(unique)} texts; "
                         "expected [texts, dim]")
    row = {text: i for i, text in enumerate(unique)}
    return vectors[[row[text] for text in texts]]


def _check_fns(names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(names)
    unknown = sorted(set(names) - set(SIMILARITY_FNS))
    if not names or unknown:
        raise ValueError(f"similarity_fn_names {list(names)}: give one or more of "
                         f"{list(SIMILARITY_FNS)}")
    return names


def _check_lengths(**columns: Sequence) -> int:
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) != 1 or not next(iter(lengths.values())):
        raise ValueError(f"the columns must be equally long and not empty; got {lengths}")
    return next(iter(lengths.values()))


def _primary(name: str, pattern: str, fns: Sequence[str]) -> str:
    primary = pattern.format("max" if len(fns) > 1 else fns[0])
    return f"{name}_{primary}" if name else primary


def _prefixed(metrics: dict[str, Any], name: str) -> dict[str, float]:
    return {(f"{name}_{key}" if name else key): float(value) for key, value in metrics.items()}


def _score_groups(scores: np.ndarray, labels: np.ndarray, greater_is_similar: bool):
    """Sorted scores (most similar first); per run of equal scores the positives and pairs
    up to it and the threshold just past it (midpoint to the next, or the score itself)."""
    order = np.argsort(-scores if greater_is_similar else scores, kind="stable")
    s, y = scores[order], labels[order]
    # Equal scores fall on the same side of any threshold, so only a run's end is a candidate.
    ends = np.flatnonzero(np.append(s[1:] != s[:-1], True))
    positives = np.cumsum(y)[ends]
    taken = ends + 1
    nxt = s[np.minimum(ends + 1, len(s) - 1)]
    mid = (s[ends] + nxt) / 2
    threshold = np.where((ends == len(s) - 1) | (mid == nxt), s[ends], mid)
    return s, positives, taken, threshold


def best_accuracy(scores: np.ndarray, labels: np.ndarray, greater_is_similar: bool
                  ) -> tuple[float, float]:
    """``(accuracy, threshold)`` of the best "similar iff score >= threshold" (``<=`` for
    distances) as sentence-transformers picks it: from "nothing is similar", a strictly
    higher accuracy only, so ties keep the strictest threshold."""
    s, positives, taken, threshold = _score_groups(scores, labels, greater_is_similar)
    n, negatives = len(s), int(np.sum(labels == 0))
    accuracy = (positives + (negatives - (taken - positives))) / n
    best_acc = negatives / n
    best_threshold = np.nextafter(s[0], np.inf if greater_is_similar else -np.inf)
    i = int(np.argmax(accuracy))  # the first maximum: the strictest of equal accuracies
    if accuracy[i] > best_acc:
        best_acc, best_threshold = accuracy[i], threshold[i]
    return float(best_acc), float(best_threshold)


def best_f1(scores: np.ndarray, labels: np.ndarray, greater_is_similar: bool
            ) -> tuple[float, float, float, float]:
    """``(f1, precision, recall, threshold)`` of the best F1, searched as
    :func:`best_accuracy`; all zero when no threshold has a positive above it."""
    _, positives, taken, threshold = _score_groups(scores, labels, greater_is_similar)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = positives / taken
        recall = positives / np.sum(labels)
        # sentence-transformers' operations and order: its ties are ours.
        f1 = np.where(positives > 0, 2 * precision * recall / (precision + recall), 0.0)
    i = int(np.argmax(f1))
    if not f1[i] > 0:
        return 0.0, 0.0, 0.0, 0.0
    return float(f1[i]), float(precision[i]), float(recall[i]), float(threshold[i])


class EmbeddingSimilarityEvaluator:
    """``pearson_{fn}``, ``spearman_{fn}`` (and ``*_max``) against gold scores, for
    ``similarity_fn_names``, else ``[main_similarity]``, else all four.
    Raises: ValueError: columns of different lengths or empty; an unknown function name, or
    a ``main_similarity`` not among ``similarity_fn_names``."""

    greater_is_better = True

    def __init__(self, sentences1: Sequence[str], sentences2: Sequence[str],
                 scores: Sequence[float], *, name: str = "", batch_size: int = 32,
                 similarity_fn_names: Sequence[str] | None = None,
                 main_similarity: str | None = None, show_progress_bar: bool = False) -> None:
        _check_lengths(sentences1=sentences1, sentences2=sentences2, scores=scores)
        self.sentences1, self.sentences2 = list(sentences1), list(sentences2)
        self.scores = np.asarray(scores, np.float64)
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        if main_similarity is not None:
            main_similarity = str(getattr(main_similarity, "value", main_similarity))
        # Neither given: sentence-transformers scores the model's own function only.
        self._model_fn = similarity_fn_names is None and main_similarity is None
        if similarity_fn_names is None:
            similarity_fn_names = ((main_similarity,) if main_similarity else
                                   ("cosine", "euclidean", "manhattan", "dot"))
        self.similarity_fn_names = _check_fns(similarity_fn_names)
        if main_similarity is not None and main_similarity not in self.similarity_fn_names:
            raise ValueError(f"main_similarity {main_similarity!r} is not one of "
                             f"similarity_fn_names {list(self.similarity_fn_names)}")
        self.main_similarity = main_similarity
        self.primary_metric = self._primary("cosine")

    def _primary(self, model_fn: str) -> str:
        if self._model_fn:
            return _primary(self.name, "spearman_{}", (model_fn,))
        if self.main_similarity is not None:
            return _primary(self.name, "spearman_{}", (self.main_similarity,))
        return _primary(self.name, "spearman_{}", self.similarity_fn_names)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> EmbeddingSimilarityEvaluator:
        """From ``sentence1``, ``sentence2``, ``score`` records. Raises DataError,
        FileNotFoundError."""
        (s1, s2), scores = read_columns(path, ("sentence1", "sentence2"), "score")
        if len(set(scores)) < 2:  # Pearson and Spearman are undefined: NaN, not a score
            raise DataError(path, None, "score", f"{len(scores)} row(s) with "
                            f"{len(set(scores))} distinct score(s); a correlation needs at "
                            "least two")
        return cls(s1, s2, scores, **kwargs)

    def __call__(self, encoder: TextEncoder) -> dict[str, float]:
        a = embed(encoder, self.sentences1, batch_size=self.batch_size,
                  show_progress_bar=self.show_progress_bar)
        b = embed(encoder, self.sentences2, batch_size=self.batch_size,
                  show_progress_bar=self.show_progress_bar)
        metrics: dict[str, Any] = {}
        for fn in self.similarity_fn_names:
            predicted = pairwise_similarity(a, b, fn)
            metrics[f"pearson_{fn}"] = stats.pearsonr(self.scores, predicted)[0]
            metrics[f"spearman_{fn}"] = stats.spearmanr(self.scores, predicted)[0]
        if len(self.similarity_fn_names) > 1:
            for kind in ("pearson", "spearman"):
                metrics[f"{kind}_max"] = max(metrics[f"{kind}_{fn}"]
                                             for fn in self.similarity_fn_names)
        model_fn = getattr(encoder, "similarity_fn_name", None)
        self.primary_metric = self._primary(model_fn if model_fn in SIMILARITY_FNS
                                            else "cosine")
        return _prefixed(metrics, self.name)


class BinaryClassificationEvaluator:
    """``{fn}_{metric}`` of :attr:`METRICS` (and ``max_*``) for pairs labelled similar (1)
    or not (0); distance thresholds are distances.
    Raises: ValueError: columns of different lengths or empty; a label not 0/1; an unknown
    function."""

    greater_is_better = True
    METRICS = ("accuracy", "accuracy_threshold", "f1", "f1_threshold", "precision", "recall",
               "ap", "mcc")

    def __init__(self, sentences1: Sequence[str], sentences2: Sequence[str],
                 labels: Sequence[int], *, name: str = "", batch_size: int = 32,
                 similarity_fn_names: Sequence[str] = ("cosine", "dot", "euclidean", "manhattan"),
                 show_progress_bar: bool = False) -> None:
        _check_lengths(sentences1=sentences1, sentences2=sentences2, labels=labels)
        if any(label not in (0, 1) for label in labels):
            raise ValueError("labels must be 0 (dissimilar) or 1 (similar)")
        self.sentences1, self.sentences2 = list(sentences1), list(sentences2)
        self.labels = np.asarray(labels, np.int64)
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.similarity_fn_names = _check_fns(similarity_fn_names)
        self.primary_metric = _primary(name, "{}_ap", self.similarity_fn_names)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> BinaryClassificationEvaluator:
        """From ``sentence1``, ``sentence2``, ``label`` (0/1) records. Raises DataError,
        FileNotFoundError."""
        (s1, s2), labels = read_columns(path, ("sentence1", "sentence2"), "label", binary=True)
        if len(set(labels)) < 2:  # AP, F1 and MCC need both classes
            raise DataError(path, None, "label", f"every label is {labels[0]}; pair "
                            "classification needs both 0 and 1")
        return cls(s1, s2, labels, **kwargs)

    def fn_metrics(self, scores: np.ndarray, greater_is_similar: bool) -> dict[str, float]:
        labels = self.labels
        accuracy, accuracy_threshold = best_accuracy(scores, labels, greater_is_similar)
        f1, precision, recall, f1_threshold = best_f1(scores, labels, greater_is_similar)
        ap = average_precision_score(labels, scores if greater_is_similar else -scores)
        predicted = scores >= f1_threshold if greater_is_similar else scores <= f1_threshold
        mcc = matthews_corrcoef(labels, predicted.astype(np.int64))
        return {"accuracy": accuracy, "accuracy_threshold": accuracy_threshold, "f1": f1,
                "f1_threshold": f1_threshold, "precision": precision, "recall": recall,
                "ap": float(ap), "mcc": float(mcc)}

    def __call__(self, encoder: TextEncoder) -> dict[str, float]:
        both = embed(encoder, self.sentences1 + self.sentences2, batch_size=self.batch_size,
                     show_progress_bar=self.show_progress_bar)
        a, b = both[: len(self.sentences1)], both[len(self.sentences1):]
        per_fn = {}
        for fn in self.similarity_fn_names:
            similarity = pairwise_similarity(a, b, fn)
            distance = fn in _DISTANCES  # thresholds on distances read as distances
            per_fn[fn] = self.fn_metrics(-similarity if distance else similarity, not distance)
        metrics = {f"{fn}_{key}": value for fn, values in per_fn.items()
                   for key, value in values.items()}
        if len(per_fn) > 1:
            metrics.update({f"max_{key}": max(values[key] for values in per_fn.values())
                            for key in self.METRICS})
        return _prefixed(metrics, self.name)


class TripletEvaluator:
    """``{fn}_accuracy`` (and ``max_accuracy``): the share of triplets with
    ``sim(anchor, positive) > sim(anchor, negative) + margin`` (one, or per function).
    Raises: ValueError: columns of different lengths or empty; an unknown function or
    margin key."""

    greater_is_better = True

    def __init__(self, anchors: Sequence[str], positives: Sequence[str],
                 negatives: Sequence[str], *, name: str = "", batch_size: int = 32,
                 similarity_fn_names: Sequence[str] = ("cosine",),
                 margin: float | Mapping[str, float] = 0.0,
                 show_progress_bar: bool = False) -> None:
        _check_lengths(anchors=anchors, positives=positives, negatives=negatives)
        self.anchors, self.positives = list(anchors), list(positives)
        self.negatives = list(negatives)
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.similarity_fn_names = _check_fns(similarity_fn_names)
        if isinstance(margin, Mapping):
            if set(margin) - set(SIMILARITY_FNS):
                raise ValueError(f"margin keys {sorted(set(margin) - set(SIMILARITY_FNS))} "
                                 f"are not among {list(SIMILARITY_FNS)}")
            self.margin = {fn: float(margin.get(fn, 0.0)) for fn in SIMILARITY_FNS}
        else:
            self.margin = dict.fromkeys(SIMILARITY_FNS, float(margin))
        self.primary_metric = _primary(name, "{}_accuracy", self.similarity_fn_names)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> TripletEvaluator:
        """From ``anchor``, ``positive``, ``negative`` records. Raises DataError,
        FileNotFoundError."""
        (anchors, positives, negatives), _ = read_columns(
            path, ("anchor", "positive", "negative"))
        return cls(anchors, positives, negatives, **kwargs)

    def __call__(self, encoder: TextEncoder) -> dict[str, float]:
        options = {"batch_size": self.batch_size, "show_progress_bar": self.show_progress_bar}
        a = embed(encoder, self.anchors, method="encode_query", **options)
        documents = embed(encoder, self.positives + self.negatives, method="encode_document",
                          **options)
        p, n = documents[: len(self.positives)], documents[len(self.positives):]
        metrics: dict[str, Any] = {}
        for fn in self.similarity_fn_names:
            beats = pairwise_similarity(a, p, fn) > pairwise_similarity(a, n, fn) + self.margin[fn]
            metrics[f"{fn}_accuracy"] = np.mean(beats)
        if len(metrics) > 1:
            metrics["max_accuracy"] = max(metrics.values())
        return _prefixed(metrics, self.name)
