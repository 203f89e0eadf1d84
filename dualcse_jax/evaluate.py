"""RTE and EIS of DualCSE and one-vector baselines (``docs/dualcse.md``, "RTE protocol", "EIS
protocol"): score rules ``RTE_SCORE_RULES``, ``implicitness(s) = 1 - cos(r_s, u_s)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from data_pipelines.inli import INLIExample
from data_pipelines.tokenization import tokenize
from dualcse_jax import data
from dualcse_jax.configs import RTE_SCORE_RULES
from dualcse_jax.inference import Embedder
from embedding_core import metrics, multihost
from embedding_core.evaluation.metrics import best_threshold_accuracy

CLASSES = ("explicit", "implied", "neutral", "contradiction")
_FIELDS = {"explicit": "explicit_entailment", "implied": "implied_entailment",
           "neutral": "neutral", "contradiction": "contradiction"}
ENTAILED = {"explicit": True, "implied": True, "neutral": False, "contradiction": False}
RULE_TEXT = {
    "max": "max(cos(r_p, r_h), cos(u_p, r_h)) > t",
    "explicit": "cos(r_p, r_h) > t",
    "implicit": "cos(u_p, r_h) > t",
    "pair": "cos(r_p, r_h) > t_r or cos(u_p, r_h) > t_u",
}
"""Each score rule's decision, for tables."""
SIMILARITIES = ("explicit", "implicit")
"""Columns of :func:`rte_similarities`: ``cos(r_p, r_h)``, ``cos(u_p, r_h)``."""


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=-1)


def check_rule(rule: str) -> str:
    """``rule`` if in ``RTE_SCORE_RULES``, else ValueError naming the choices."""
    if rule not in RTE_SCORE_RULES:
        raise ValueError(f"RTE score rule {rule!r}: use one of {', '.join(RTE_SCORE_RULES)}")
    return rule


def parse_rules(text: str | None) -> list[str] | None:
    """``--rte_score_rules``: ``"all"`` or comma-separated rules; blank: None; ValueError."""
    if text is None or not text.strip():
        return None
    if text.strip() == "all":
        return list(RTE_SCORE_RULES)
    return [check_rule(r.strip()) for r in text.split(",") if r.strip()]


@dataclasses.dataclass(frozen=True)
class RTEVectors:
    """One RTE set encoded once: premises' r, u ``[n, dim]`` float32, sorted hypotheses, their r."""

    premise_r: np.ndarray
    premise_u: np.ndarray
    hypotheses: tuple[str, ...]
    hypothesis_r: np.ndarray

    def hypothesis_rows(self, texts: Sequence[str]) -> np.ndarray:
        """r of each of ``texts`` (from :attr:`hypotheses`), ``[len(texts), dim]``."""
        index = {h: i for i, h in enumerate(self.hypotheses)}
        return self.hypothesis_r[[index[h] for h in texts]]


def encode_rte(embedder: Embedder, examples: Sequence[INLIExample],
               progress: bool = False) -> RTEVectors:
    """:class:`RTEVectors` of a set; each process encodes a slice, all get all."""
    premises = [ex.premise for ex in examples]
    unique = sorted({getattr(ex, _FIELDS[c]) for ex in examples for c in CLASSES})
    r_p = multihost.encode(embedder, premises, kind="explicit", show_progress_bar=progress)
    u_p = r_p if embedder.model.architecture == "simcse" else multihost.encode(
        embedder, premises, kind="implicit", show_progress_bar=progress)  # r = u
    r_h = multihost.encode(embedder, unique, kind="explicit", show_progress_bar=progress)
    return RTEVectors(r_p, u_p, tuple(unique), r_h)


def similarities_of(vectors: RTEVectors, examples: Sequence[INLIExample]
                    ) -> dict[str, np.ndarray]:
    """:func:`rte_similarities` from :func:`encode_rte`'s vectors."""
    out = {}
    for c in CLASSES:
        rh = vectors.hypothesis_rows([getattr(ex, _FIELDS[c]) for ex in examples])
        out[c] = np.stack([_cos_rows(vectors.premise_r, rh), _cos_rows(vectors.premise_u, rh)],
                          axis=1).astype(np.float32)
    return out


def rte_similarities(embedder: Embedder, examples: Sequence[INLIExample],
                     progress: bool = False) -> dict[str, np.ndarray]:
    """``{class: [n_premises, 2] float32}``: ``cos(r_p, r_h)``, ``cos(u_p, r_h)`` per pair."""
    return similarities_of(encode_rte(embedder, examples, progress), examples)


def one_score(sims: np.ndarray, rule: str) -> np.ndarray:
    """A one-score rule's score from ``[..., 2]`` cosines; ValueError: ``pair``, unknown rules."""
    if check_rule(rule) == "pair":
        raise ValueError("rule 'pair' has two scores per pair; use rte_similarities")
    return sims.max(axis=-1) if rule == "max" else sims[..., SIMILARITIES.index(rule)]


def _cut(unique: np.ndarray, k: int) -> float:
    """Threshold between ``unique[k - 1]`` and ``unique[k]`` (-inf, +inf or a midpoint)."""
    if k == 0:
        return -np.inf
    if k == len(unique):
        return np.inf
    lo, hi = unique[k - 1], unique[k]
    with np.errstate(over="ignore"):
        mid = lo + (hi - lo) / 2
    if not np.isfinite(mid):
        mid = lo / 2 + hi / 2
    return float(lo if (mid >= hi or mid < lo) else mid)


def best_threshold_pair_accuracy(explicit, implicit, labels, *, chunk: int = 256
                                 ) -> tuple[float, float, float]:
    """``(t_r, t_u, accuracy)`` of the best "``explicit > t_r`` or ``implicit > t_u``" over every
    distinct classification of ``[n]`` scores and bool labels (ties: smallest ``t_r``, ``t_u``);
    ValueError: empty or NaN input, differing shapes, non-binary labels."""
    s_r = np.asarray(explicit, np.float64)
    s_u = np.asarray(implicit, np.float64)
    y = np.asarray(labels)
    if s_r.ndim != 1 or s_r.shape != s_u.shape or y.shape != s_r.shape:
        raise ValueError(f"explicit, implicit and labels must be [n] alike; got {s_r.shape}, "
                         f"{s_u.shape}, {y.shape}")
    if s_r.size == 0:
        raise ValueError("best_threshold_pair_accuracy needs at least one example")
    if np.isnan(s_r).any() or np.isnan(s_u).any():
        raise ValueError("best_threshold_pair_accuracy: NaN scores")
    if y.dtype != np.bool_:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be bool or 0/1")
        y = y.astype(bool)
    unique_r = np.unique(s_r)
    order = np.argsort(s_u, kind="stable")
    u_sorted, y_sorted, r_by_u = s_u[order], y[order], s_r[order]
    run_end = np.flatnonzero(np.append(u_sorted[1:] != u_sorted[:-1], True))
    unique_u = u_sorted[run_end]
    n_pos = int(y.sum())
    cuts = [_cut(unique_r, k) for k in range(len(unique_r) + 1)]
    best = (-1, 0, 0)  # (correct, k, j)
    for lo in range(0, len(cuts), chunk):
        t_r = np.asarray(cuts[lo:lo + chunk])
        rest = r_by_u[None, :] <= t_r[:, None]  # [c, n] not called positive by r
        pos_rest = rest & y_sorted[None, :]
        neg_rest = rest & ~y_sorted[None, :]
        n_pos_rest = pos_rest.sum(axis=1)
        pos_le = np.cumsum(pos_rest, axis=1)[:, run_end]
        neg_le = np.cumsum(neg_rest, axis=1)[:, run_end]
        # Column 0: t_u = -inf (the rest all positive); column j: t_u after unique_u[j-1].
        correct = np.concatenate(
            [n_pos_rest[:, None], neg_le + (n_pos_rest[:, None] - pos_le)], axis=1)
        correct += (n_pos - n_pos_rest)[:, None]  # true positives called by r
        flat = int(np.argmax(correct))  # first maximum: smallest t_r, then t_u
        k, j = divmod(flat, correct.shape[1])
        if correct[k, j] > best[0]:
            best = (int(correct[k, j]), lo + k, j)
    correct, k, j = best
    return cuts[k], _cut(unique_u, j), correct / s_r.size


def _predict(sims: np.ndarray, rule: str, thresholds: tuple[float, ...]) -> np.ndarray:
    if rule == "pair":
        return (sims[:, 0] > thresholds[0]) | (sims[:, 1] > thresholds[1])
    return one_score(sims, rule) > thresholds[0]


def tune_rule(val_sims: Mapping[str, np.ndarray], rule: str) -> tuple[float, ...]:
    """``(t,)`` (``pair``: ``(t_r, t_u)``) best on the pooled val pairs; ValueError."""
    check_rule(rule)
    sims = np.concatenate([val_sims[c] for c in CLASSES])
    y = np.concatenate([np.full(len(val_sims[c]), ENTAILED[c]) for c in CLASSES])
    if rule == "pair":
        t_r, t_u, _ = best_threshold_pair_accuracy(sims[:, 0], sims[:, 1], y)
        return t_r, t_u
    return (best_threshold_accuracy(one_score(sims, rule), y)[0],)


def rte_correct(val_sims: Mapping[str, np.ndarray], test_sims: Mapping[str, np.ndarray],
                rule: str) -> tuple[dict[str, np.ndarray], tuple[float, ...]]:
    """``({class: [n_test] bool}, thresholds)``: right under :func:`tune_rule`'s val thresholds."""
    thresholds = tune_rule(val_sims, rule)
    return ({c: _predict(test_sims[c], rule, thresholds) == ENTAILED[c] for c in CLASSES},
            thresholds)


def class_items(test_sims: Mapping[str, np.ndarray], cls: str, rule: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """Scores and entailed labels ``[n]`` of one class against every pair of the other label;
    ``cls="all"``: every pair (``docs/dualcse.md``)."""
    parts = CLASSES if cls == "all" else (
        cls, *(c for c in CLASSES if ENTAILED[c] != ENTAILED[cls]))
    scores = np.concatenate([one_score(test_sims[c], rule) for c in parts])
    labels = np.concatenate([np.full(len(test_sims[c]), ENTAILED[c]) for c in parts])
    return scores, labels


def threshold_free(test_sims: Mapping[str, np.ndarray], rule: str) -> dict[str, dict]:
    """``{"auc": {class: v}, "ap": {class: v}}`` of :func:`class_items`; ``{}`` for ``pair``."""
    if rule == "pair":
        return {}
    out: dict[str, dict] = {"auc": {}, "ap": {}}
    for c in (*CLASSES, "all"):
        scores, labels = class_items(test_sims, c, rule)
        out["auc"][c] = metrics.roc_auc(scores, labels)
        out["ap"][c] = float(metrics.average_precision_rows(scores[None], labels[None])[0])
    return out


def rte_result(val_sims: Mapping[str, np.ndarray], test_sims: Mapping[str, np.ndarray],
               rule: str) -> dict[str, float]:
    """Accuracy per class and ``"average"``, ``"threshold"`` (``pair``: ``"threshold_explicit"``,
    ``"threshold_implicit"``), and :func:`threshold_free`'s ``"auc"``, ``"ap"``."""
    correct, thresholds = rte_correct(val_sims, test_sims, rule)
    result = {c: float(np.mean(correct[c])) for c in CLASSES}
    result["average"] = float(np.mean([result[c] for c in CLASSES]))
    if rule == "pair":
        result["threshold_explicit"], result["threshold_implicit"] = thresholds
    else:
        result["threshold"] = thresholds[0]
    return {**result, **threshold_free(test_sims, rule)}


def evaluate_rte_rules(embedder: Embedder, val: Sequence[INLIExample],
                       test: Sequence[INLIExample], rules: Sequence[str],
                       progress: bool = False) -> dict[str, dict[str, float]]:
    """:func:`rte_result` of several rules (checked first) from one encoding."""
    for rule in rules:
        check_rule(rule)
    val_sims = rte_similarities(embedder, val, progress)
    # Training-time evaluation passes one list as both: encode it once (half the cost).
    test_sims = val_sims if test is val else rte_similarities(embedder, test, progress)
    return {rule: rte_result(val_sims, test_sims, rule) for rule in rules}


def evaluate_rte(embedder: Embedder, val: Sequence[INLIExample], test: Sequence[INLIExample],
                 progress: bool = False, rule: str | None = None) -> dict[str, float]:
    """:func:`rte_result` of ``rule`` (``None``: the run's ``eval_rte_score_rule``)."""
    if rule is None:
        rule = str(embedder.config.get("eval_rte_score_rule", "max"))
    return evaluate_rte_rules(embedder, val, test, (rule,), progress)[rule]


def rte_evaluator(model, tokenizer, config, val: list[INLIExample] | None = None):
    """``(params, step) -> {val_rte_*}`` on the first ``eval_examples`` val rows."""
    val = (data.val_examples(config) if val is None else val)[: config.eval_examples]
    embedder = Embedder(model, None, tokenizer, config)  # compiled once

    def evaluate(params, step):
        embedder.params, embedder.step = params, step
        out = {}
        for k, v in evaluate_rte(embedder, val, val).items():
            if isinstance(v, dict):  # auc / ap per class
                out.update({f"val_rte_{k}_{c}": x for c, x in v.items()})
            else:
                out[f"val_rte_{k}"] = v
        return out

    return evaluate


def label_conflicts(examples: Sequence[INLIExample],
                    key: Callable[[str], Hashable] | None = None) -> dict:
    """Rows giving one sentence (equal under ``key``) under an entailed and a non-entailed class:
    ``{"rows", "index", "line", "classes"}`` (``docs/dualcse.md``)."""
    key = key or (lambda text: " ".join(text.split()))
    out: dict = {"rows": 0, "index": [], "line": [], "classes": []}
    for i, ex in enumerate(examples):
        by_text: dict[Hashable, list[str]] = {}
        for c in CLASSES:
            by_text.setdefault(key(getattr(ex, _FIELDS[c])), []).append(c)
        for classes in by_text.values():
            if len({ENTAILED[c] for c in classes}) > 1:
                out["rows"] += 1
                out["index"].append(i)
                out["line"].append(getattr(ex, "line", None))
                out["classes"].append(classes)
    return out


def token_key(embedder: Embedder) -> Callable[[str], tuple[int, ...]] | None:
    """A :func:`label_conflicts` key: a text's token ids as ``embedder`` encodes it (or None)."""
    if getattr(embedder, "tokenizer", None) is None:
        return None

    def key(text: str) -> tuple[int, ...]:
        tok = tokenize(embedder.tokenizer, [text], int(embedder.config.max_length))
        return tuple(int(t) for t in tok.input_ids[0, :int(tok.lengths[0])])
    return key


def format_label_conflicts(conflicts: dict[str, dict]) -> str:
    """One line per split with conflicting rows, '' when none."""
    lines = []
    for split, found in conflicts.items():
        if found["rows"]:
            where = ", ".join(f"{i} (line {n}: {' = '.join(c)})" for i, n, c in
                              zip(found["index"], found["line"], found["classes"], strict=True))
            lines.append(f"note: {found['rows']} {split} row(s) give one sentence under an "
                         f"entailed and a non-entailed class, so one of the two pairs is always "
                         f"scored wrong: {'rows' if found['rows'] > 1 else 'row'} {where}")
    return "\n".join(lines)


def _implicitness(embedder: Embedder, r: np.ndarray, u: np.ndarray) -> np.ndarray:
    if embedder.model.architecture == "simcse":  # exactly 0, not 1 - cos(r, r)'s noise
        return np.zeros(len(r), np.float32)
    return (1.0 - _cos_rows(r, u)).astype(np.float32)


def implicitness(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """``1 - cos(r_s, u_s)`` per sentence, ``[n]`` float32; 0 for a one-vector model."""
    r = multihost.encode(embedder, texts, kind="explicit")
    u = r if embedder.model.architecture == "simcse" else multihost.encode(
        embedder, texts, kind="implicit")
    return _implicitness(embedder, r, u)


def eis_correct(embedder: Embedder, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """``[n]`` bool: the implicit sentence scores higher (ties fail); ValueError for no pairs."""
    if not pairs:
        raise ValueError("evaluate_eis needs at least one (implicit, explicit) pair")
    imp = implicitness(embedder, [p[0] for p in pairs])
    exp = implicitness(embedder, [p[1] for p in pairs])
    return imp > exp


def evaluate_eis(embedder: Embedder, pairs: Sequence[tuple[str, str]]) -> float:
    """:func:`eis_correct`'s mean over ``(implicit, explicit)`` pairs."""
    return float(np.mean(eis_correct(embedder, pairs)))


def inli_eis_proxy_correct(embedder: Embedder, examples: Sequence[INLIExample],
                           vectors: RTEVectors) -> np.ndarray:
    """:func:`eis_correct` of :func:`inli_eis_proxy_pairs` from the RTE vectors ``[n_premises]``."""
    implied = [ex.implied_entailment for ex in examples]
    r_h = vectors.hypothesis_rows(implied)
    u_h = r_h if embedder.model.architecture == "simcse" else multihost.encode(
        embedder, implied, kind="implicit")
    premise = _implicitness(embedder, vectors.premise_r, vectors.premise_u)
    return premise > _implicitness(embedder, r_h, u_h)


def inli_eis_proxy_pairs(examples: Sequence[INLIExample]) -> list[tuple[str, str]]:
    """A PROXY for EIS, (premise, implied entailment) pairs: reports must say so."""
    return [(ex.premise, ex.implied_entailment) for ex in examples]


def impscore_pairs(rows) -> list[tuple[str, str]]:
    """(implicit, explicit) pairs of ImpScore rows, two per row (pos_, neg_)."""
    return [pair for row in rows for pair in ((row.pos_implicit, row.pos_explicit),
                                              (row.neg_implicit, row.neg_explicit))]


def format_rte_table(rows: dict[str, dict[str, float]]) -> str:
    """Fixed-width table of accuracies in percent; one-score rules add ROC-AUC per class."""
    head = f"{'model':<28}" + "".join(f"{c:>14}" for c in (*CLASSES, "average"))
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<28}" + "".join(f"{100 * r[c]:>14.2f}"
                                            for c in (*CLASSES, "average")))
    if all("auc" in r for r in rows.values()):
        lines += ["", "ROC-AUC (%), no threshold: each class against the pairs of the other "
                  "label (AP in rte.json)", f"{'model':<28}" + "".join(
                      f"{c:>14}" for c in (*CLASSES, "all")), "-" * len(head)]
        for name, r in rows.items():
            lines.append(f"{name:<28}" + "".join(f"{100 * r['auc'][c]:>14.2f}"
                                                for c in (*CLASSES, "all")))
    return "\n".join(lines)
