"""RTE and EIS evaluation of DualCSE (and of one-vector baselines).

Protocols are our reading of Oda et al. 2025 (``docs/dualcse.md``):

* RTE: a (premise, hypothesis) pair is called entailed when its score exceeds a threshold
  tuned on INLI val for accuracy; DualCSE's score is
  ``max(cos(r_p, r_h), cos(u_p, r_h))`` (for one-vector models r = u, so it is
  ``cos(e_p, e_h)``). Accuracy is reported per hypothesis class on the test split
  (explicit and implied should be entailed, neutral and contradiction should not) and as
  the mean of the four.
* EIS: ``implicitness(s) = 1 - cos(r_s, u_s)``; accuracy is the share of (implicit,
  explicit) sentence pairs where the implicit one scores higher.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from data_pipelines.inli import INLIExample
from dualcse_jax.inference import Embedder
from embedding_core import multihost
from embedding_core.metrics import accuracy_at_threshold, best_threshold_accuracy

CLASSES = ("explicit", "implied", "neutral", "contradiction")
_FIELDS = {"explicit": "explicit_entailment", "implied": "implied_entailment",
           "neutral": "neutral", "contradiction": "contradiction"}
ENTAILED = {"explicit": True, "implied": True, "neutral": False, "contradiction": False}


def _cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=-1)


def rte_scores(embedder: Embedder, examples: Sequence[INLIExample],
               progress: bool = False) -> dict[str, np.ndarray]:
    """Entailment scores per hypothesis class.

    Several processes each encode a slice of the sentences
    (``embedding_core.multihost.encode``); every process gets all scores.

    Returns:
      ``{class: [n_premises] float32}`` with ``max(cos(r_p, r_h), cos(u_p, r_h))``.
    """
    premises = [ex.premise for ex in examples]
    hyps = {c: [getattr(ex, _FIELDS[c]) for ex in examples] for c in CLASSES}
    unique = sorted({h for hs in hyps.values() for h in hs})
    index = {h: i for i, h in enumerate(unique)}
    r_p = multihost.encode(embedder, premises, kind="explicit", show_progress_bar=progress)
    u_p = r_p if embedder.model.architecture == "simcse" else multihost.encode(
        embedder, premises, kind="implicit", show_progress_bar=progress)  # r = u
    r_h = multihost.encode(embedder, unique, kind="explicit", show_progress_bar=progress)
    out = {}
    for c, hs in hyps.items():
        rh = r_h[[index[h] for h in hs]]
        out[c] = np.maximum(_cos_rows(r_p, rh), _cos_rows(u_p, rh)).astype(np.float32)
    return out


def _flatten(scores: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    s = np.concatenate([scores[c] for c in CLASSES])
    y = np.concatenate([np.full(len(scores[c]), ENTAILED[c]) for c in CLASSES])
    return s, y


def evaluate_rte(embedder: Embedder, val: Sequence[INLIExample], test: Sequence[INLIExample],
                 progress: bool = False) -> dict[str, float]:
    """Threshold tuned on ``val`` pairs, accuracies on ``test`` pairs.

    Returns:
      ``{"explicit", "implied", "neutral", "contradiction", "average", "threshold"}``;
      accuracies in [0, 1], ``average`` the mean of the four class accuracies.
    """
    val_scores = rte_scores(embedder, val, progress)
    threshold, _ = best_threshold_accuracy(*_flatten(val_scores))
    # Training-time evaluation passes one list as both: encode it once (half the cost).
    test_scores = val_scores if test is val else rte_scores(embedder, test, progress)
    result = {}
    for c in CLASSES:
        labels = np.full(len(test_scores[c]), ENTAILED[c])
        result[c] = float(accuracy_at_threshold(test_scores[c], labels, threshold))
    result["average"] = float(np.mean([result[c] for c in CLASSES]))
    result["threshold"] = float(threshold)
    return result


def label_conflicts(examples: Sequence[INLIExample]) -> dict:
    """Rows whose one hypothesis sentence stands under an entailed and a non-entailed class.

    Such a row scores the same pair twice (same premise, same sentence: equal scores), so
    at any threshold exactly one of the two is wrong. Sentences are compared with their
    whitespace collapsed (the tokenizer does not see the difference). In the shipped INLI,
    val rows 9 and 264 (file lines 11 and 266) and test row 571 (line 573) give one
    sentence as both implied entailment and contradiction (``docs/dualcse.md``); a sentence
    under two classes of the same side (explicit and implied) costs nothing and is not
    counted.

    Returns:
      ``{"rows": n, "index": [0-based row], "line": [file line or None], "classes":
      [[class, class], ...]}``, one entry per conflicting row, in file order.
    """
    out: dict = {"rows": 0, "index": [], "line": [], "classes": []}
    for i, ex in enumerate(examples):
        by_text: dict[str, list[str]] = {}
        for c in CLASSES:
            by_text.setdefault(" ".join(getattr(ex, _FIELDS[c]).split()), []).append(c)
        for classes in by_text.values():
            if len({ENTAILED[c] for c in classes}) > 1:
                out["rows"] += 1
                out["index"].append(i)
                out["line"].append(getattr(ex, "line", None))
                out["classes"].append(classes)
    return out


def format_label_conflicts(conflicts: dict[str, dict]) -> str:
    """One line per split with conflicting rows (``label_conflicts``), '' when none."""
    lines = []
    for split, found in conflicts.items():
        if found["rows"]:
            where = ", ".join(f"{i} (line {n}: {' = '.join(c)})" for i, n, c in
                              zip(found["index"], found["line"], found["classes"], strict=True))
            lines.append(f"note: {found['rows']} {split} row(s) give one sentence under an "
                         f"entailed and a non-entailed class, so one of the two pairs is always "
                         f"scored wrong: {'rows' if found['rows'] > 1 else 'row'} {where}")
    return "\n".join(lines)


def implicitness(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """``1 - cos(r_s, u_s)`` per sentence, ``[n]`` float32 (higher = more implicit)."""
    r = multihost.encode(embedder, texts, kind="explicit")
    u = multihost.encode(embedder, texts, kind="implicit")
    return (1.0 - _cos_rows(r, u)).astype(np.float32)


def evaluate_eis(embedder: Embedder, pairs: Sequence[tuple[str, str]]) -> float:
    """Share of ``(implicit, explicit)`` pairs whose implicit sentence scores higher.

    Ties count as failures (no tie is resolved in the model's favour).
    """
    if not pairs:
        raise ValueError("evaluate_eis needs at least one (implicit, explicit) pair")
    imp = implicitness(embedder, [p[0] for p in pairs])
    exp = implicitness(embedder, [p[1] for p in pairs])
    return float(np.mean(imp > exp))


def inli_eis_proxy_pairs(examples: Sequence[INLIExample]) -> list[tuple[str, str]]:
    """PROXY for EIS on INLI: (premise, its explicit-entailment hypothesis) pairs.

    ImpScore's data is not shipped; this proxy treats an INLI premise as the implicit
    sentence and its explicit entailment as the explicit one. Reports must call it a proxy.
    """
    return [(ex.premise, ex.explicit_entailment) for ex in examples]


def impscore_pairs(rows) -> list[tuple[str, str]]:
    """(implicit, explicit) pairs of ImpScore rows (two per row: pos_ and neg_ columns)."""
    pairs = []
    for row in rows:
        pairs.append((row.pos_implicit, row.pos_explicit))
        pairs.append((row.neg_implicit, row.neg_explicit))
    return pairs


def format_rte_table(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width table, one line per model, accuracies in percent."""
    head = f"{'model':<28}" + "".join(f"{c:>14}" for c in (*CLASSES, "average"))
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<28}" + "".join(f"{100 * r[c]:>14.2f}"
                                            for c in (*CLASSES, "average")))
    return "\n".join(lines)
