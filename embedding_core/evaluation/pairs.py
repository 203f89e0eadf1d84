"""Pair and triplet evaluators with sentence-transformers' numbers and metric names:
:class:`EmbeddingSimilarityEvaluator` (Pearson/Spearman against gold scores),
:class:`BinaryClassificationEvaluator` (best-threshold accuracy/F1, AP, MCC) and
:class:`TripletEvaluator` (how often the positive beats the negative).

Each is called as ``evaluator(encoder) -> dict[str, float]``; ``encoder`` is anything with
``SentenceTransformer.encode``'s ``encode(texts, batch_size=, show_progress_bar=,
convert_to_numpy=True)`` returning float32 ``[n, d]`` (``embedding_core.serving.inference.Encoder``
or a ``SentenceTransformer``). Files: ``from_file`` (``embedding_core.evaluation.pair_files``).
"""

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
    """float64 ``[n]``: similarity of row i of ``a`` with row i of ``b`` (both ``[n, d]``).

    cosine: ``a.b / (max(|a|, eps) max(|b|, eps))``, eps 1e-12 (torch's normalize);
    dot: ``a.b``; euclidean: ``-|a - b|_2``; manhattan: ``-|a - b|_1``.
    """
    # float64: the same numbers as sentence-transformers' float32 up to its rounding (~1e-7).
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
    """float32 ``[len(texts), d]``, each distinct text encoded once (in first-seen order, so
    the batches do not depend on hash order); ``method``: ``encode``, or ``encode_query`` /
    ``encode_document`` where the encoder has them (else ``encode``)."""
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
    """sentence-transformers' primary metric: ``pattern`` of ``max`` with several
    functions, else of the one function; prefixed ``{name}_`` when named."""
    primary = pattern.format("max" if len(fns) > 1 else fns[0])
    return f"{name}_{primary}" if name else primary


def _prefixed(metrics: dict[str, Any], name: str) -> dict[str, float]:
    return {(f"{name}_{key}" if name else key): float(value) for key, value in metrics.items()}


def _score_groups(scores: np.ndarray, labels: np.ndarray, greater_is_similar: bool):
    """Scores sorted from most to least similar, and per run of equal scores: its end index,
    the positives and the pairs up to it, and the threshold just past it (the midpoint to the
    next score; the score itself for the last run or where the midpoint rounds onto the next)."""
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
    """``(accuracy, threshold)`` of the best rule "similar iff score >= threshold" (``<=`` for
    distances, ``greater_is_similar=False``), as sentence-transformers picks it: starting from
    "nothing is similar" (threshold one step past the most similar score), a run of equal
    scores replaces the best only with a strictly higher accuracy, so ties keep the strictest
    threshold. ``scores``: ``[n]`` float; ``labels``: ``[n]`` 0/1.
    """
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
    """``(f1, precision, recall, threshold)`` of the threshold with the best F1, searched as
    :func:`best_accuracy` (first strict maximum), among runs with a positive at or above
    them; all zero when no threshold has one. ``F1 = 2 P R / (P + R)``.
    """
    _, positives, taken, threshold = _score_groups(scores, labels, greater_is_similar)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = positives / taken
        recall = positives / np.sum(labels)
        # Same operations in the same order as sentence-transformers: equal F1 values are then
        # equal floats, and a tie goes to the same (first) threshold.
        f1 = np.where(positives > 0, 2 * precision * recall / (precision + recall), 0.0)
    i = int(np.argmax(f1))
    if not f1[i] > 0:
        return 0.0, 0.0, 0.0, 0.0
    return float(f1[i]), float(precision[i]), float(recall[i]), float(threshold[i])


class EmbeddingSimilarityEvaluator:
    """Pearson and Spearman correlation of each similarity with gold scores.

    Metrics: ``pearson_{fn}``, ``spearman_{fn}`` per function, ``pearson_max`` and
    ``spearman_max`` with more than one; all prefixed ``{name}_`` when ``name`` is set.
    Functions: ``similarity_fn_names``, else ``[main_similarity]``, else all four (a
    superset of sentence-transformers' ``[model.similarity_fn_name]``).
    :attr:`primary_metric` is sentence-transformers' for the same arguments:
    ``spearman_{main_similarity}``; without it ``spearman_max`` for several given functions,
    ``spearman_{fn}`` for one, and for none given ``spearman_{encoder.similarity_fn_name}``
    (set when called; ``cosine`` for an encoder without one).

    Raises:
      ValueError: columns of different lengths or empty; an unknown function name, or a
        ``main_similarity`` not among ``similarity_fn_names``.
    """

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
        """From a file of ``sentence1``, ``sentence2``, ``score`` (float) records.

        Raises:
          DataError, FileNotFoundError: as ``pair_files.read_columns``.
        """
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
    """Whether pairs are similar (label 1) or not (0), by a threshold on each similarity.

    Per function ``fn``: ``{fn}_accuracy``, ``{fn}_accuracy_threshold`` (:func:`best_accuracy`),
    ``{fn}_f1``, ``{fn}_f1_threshold``, ``{fn}_precision``, ``{fn}_recall`` (:func:`best_f1`),
    ``{fn}_ap`` (average precision) and ``{fn}_mcc`` (Matthews correlation at the F1
    threshold). Thresholds of euclidean and manhattan are distances (similar iff
    ``distance <= threshold``), of cosine and dot similarities (``>=``). With more than one
    function also ``max_{metric}`` for each of the eight (thresholds too, as
    sentence-transformers does). Prefix ``{name}_`` when set. :attr:`primary_metric`:
    ``max_ap``, or ``{fn}_ap`` with one function.

    Raises:
      ValueError: columns of different lengths or empty; a label not 0/1; an unknown function.
    """

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
        """From a file of ``sentence1``, ``sentence2``, ``label`` (0 or 1) records.

        Raises:
          DataError, FileNotFoundError: as ``pair_files.read_columns``.
        """
        (s1, s2), labels = read_columns(path, ("sentence1", "sentence2"), "label", binary=True)
        if len(set(labels)) < 2:  # AP, F1 and MCC need both classes
            raise DataError(path, None, "label", f"every label is {labels[0]}; pair "
                            "classification needs both 0 and 1")
        return cls(s1, s2, labels, **kwargs)

    def fn_metrics(self, scores: np.ndarray, greater_is_similar: bool) -> dict[str, float]:
        """The eight metrics of one function's ``[n]`` scores (distances: not similar)."""
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
        # One call over both columns: a text in both is encoded once (sentence-transformers too).
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
    """Accuracy on ``(anchor, positive, negative)``: the share of triplets with
    ``sim(anchor, positive) > sim(anchor, negative) + margin`` (strictly; distances enter as
    negative distances, so a margin asks the negative to be that much farther).

    Anchors are encoded with the encoder's ``encode_query``, positives and negatives with its
    ``encode_document`` where it has them (as sentence-transformers does), else ``encode``.

    Metrics: ``{fn}_accuracy``, ``max_accuracy`` with more than one function; prefix ``{name}_``.
    :attr:`primary_metric`: ``max_accuracy`` or ``{fn}_accuracy``.

    Args:
      margin: one for all functions, or per function name (missing ones: 0).

    Raises:
      ValueError: columns of different lengths or empty; an unknown function or margin key.
    """

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
        """From a file of ``anchor``, ``positive``, ``negative`` records.

        Raises:
          DataError, FileNotFoundError: as ``pair_files.read_columns``.
        """
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
