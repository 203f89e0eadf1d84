"""Evaluators named on a command line or in a config, run on any encoder.

A spec is ``KIND:PATH`` (``ir:``, ``sts:``, ``pairs:``, ``triplets:``; local or ``gs://``);
``ir`` takes a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) or a
JSON Lines file of ``{"query", "positive", ["negatives"]}``. Results keep
sentence-transformers' metric names (``docs/evaluation.md``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from embedding_core.storage import storage

KINDS = ("ir", "sts", "pairs", "triplets")
WHAT = {"ir": "retrieval", "sts": "similarity", "pairs": "pair classification",
        "triplets": "triplets"}


def parse_spec(spec: str) -> tuple[str, str]:
    """``"ir:gs://b/beir"`` -> ``("ir", "gs://b/beir")``.

    Raises:
      ValueError: no ``KIND:`` prefix, or an unknown kind (the spec named).
    """
    kind, sep, path = str(spec).partition(":")
    kind, path = kind.strip(), path.strip()  # "sts: a.csv" is a.csv
    if not sep or kind not in KINDS or not path:
        raise ValueError(f"evaluation {spec!r}: write KIND:PATH with KIND one of {KINDS} "
                         "(ir:BEIR_DIR_OR_JSONL, sts:FILE, pairs:FILE, triplets:FILE)")
    return kind, path


def build(kind: str, path: str, *, batch_size: int = 32, ir_split: str = "test") -> Any:
    """The evaluator of one spec, its file read now (so bad input fails before any work).

    Raises:
      FileNotFoundError: ``PATH does not exist`` (the caller names the flag or field).
      ValueError: a bare ``gs://`` bucket; a folder for a kind that reads one file.
      DataError: a bad row (file, line, field).
    """
    from embedding_core.evaluation import pairs, retrieval

    storage.check_not_bucket(path)
    where = storage.as_path(path)
    if not where.exists():
        raise FileNotFoundError(f"{storage.display(path)} does not exist")
    if kind == "ir":
        if where.is_dir():
            return retrieval.InformationRetrievalEvaluator.from_beir(
                path, split=ir_split, batch_size=batch_size)
        return retrieval.InformationRetrievalEvaluator.from_jsonl(path, batch_size=batch_size)
    if where.is_dir():
        raise ValueError(f"{storage.display(path)} is a folder; {kind} reads one CSV or JSON "
                         "Lines file")
    cls = {"sts": pairs.EmbeddingSimilarityEvaluator,
           "pairs": pairs.BinaryClassificationEvaluator, "triplets": pairs.TripletEvaluator}[kind]
    return cls.from_file(path, batch_size=batch_size)


def build_flags(specs: Iterable[str], **kwargs: Any) -> list[tuple[str, str, Any]]:
    """``(kind, path, evaluator)`` of command-line specs (:func:`build`'s ``kwargs``), bad
    files first, before any model loads.

    Raises:
      FileNotFoundError, ValueError: ``--KIND PATH ...`` (the flag and the path named).
      DataError: a bad row (file, line, field).
    """
    from embedding_core.errors import DataError

    out = []
    for kind, path in map(parse_spec, specs):
        try:
            out.append((kind, path, build(kind, path, **kwargs)))
        except DataError:
            raise
        except (FileNotFoundError, ValueError) as e:
            wrap = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
            raise wrap(f"--{kind} {e}") from None
    return out


class ViewOf:
    """An encoder with fixed keyword arguments on every encode (one view of a two-view
    model: DualCSE's ``kind``, MRWE's ``side``)."""

    def __init__(self, encoder: Any, kwargs: Mapping[str, Any]) -> None:
        self.encoder, self.kwargs = encoder, dict(kwargs)

    def encode(self, texts, **kwargs: Any):
        return self.encoder.encode(texts, **{**self.kwargs, **kwargs})

    def encode_query(self, texts, **kwargs: Any):
        return self.encoder.encode_query(texts, **{**self.kwargs, **kwargs})

    def encode_document(self, texts, **kwargs: Any):
        return self.encoder.encode_document(texts, **{**self.kwargs, **kwargs})


def view_of(encoder: Any, view: str | None) -> Any:
    """``encoder`` as its export view ``view`` encodes (``None``: as it is).

    Raises:
      ValueError: a view the model does not have or that takes no texts (names listed).
    """
    if view is None:
        return encoder
    views = {v.name: v for v in getattr(encoder, "views", ()) if v.encode_kwargs is not None}
    if view not in views:
        raise ValueError(f"view {view!r}: {getattr(encoder, 'name', 'the model')} encodes "
                         f"texts as {sorted(views) or 'itself only (no --view)'}")
    return ViewOf(encoder, views[view].encode_kwargs)


def evaluate(encoder: Any, specs: Iterable[str], *, batch_size: int = 32,
             ir_split: str = "test", evaluators: Sequence[tuple[str, str, Any]] | None = None
             ) -> dict[str, dict[str, Any]]:
    """Runs every spec on ``encoder``; ``{label: {"kind", "file", "primary_metric",
    "metrics": {name: float}}}`` with ``label`` the kind, or ``kind:file stem`` when a kind
    comes twice, and for retrieval ``"dropped_queries"`` (queries without a relevant
    document, not scored). ``evaluators``: already built ``(kind, path, evaluator)``
    (training)."""
    if evaluators is None:
        evaluators = [(kind, path, build(kind, path, batch_size=batch_size, ir_split=ir_split))
                      for kind, path in map(parse_spec, specs)]
    labels = _labels([(kind, path) for kind, path, _ in evaluators])
    results = {}
    for label, (kind, path, evaluator) in zip(labels, evaluators, strict=True):
        metrics = {k: float(v) for k, v in evaluator(encoder).items()}
        results[label] = {"kind": kind, "file": storage.display(path),
                          "primary_metric": evaluator.primary_metric, "metrics": metrics}
        if hasattr(evaluator, "dropped_queries"):
            results[label]["dropped_queries"] = int(evaluator.dropped_queries)
    return results


def _labels(specs: Sequence[tuple[str, str]]) -> list[str]:
    """The kind alone when it comes once, else ``kind:stem``, numbered ``#2, #3, ...``
    when two files share a stem, so no result overwrites another."""
    kinds = [kind for kind, _ in specs]
    labels = [kind if kinds.count(kind) == 1 else
              f"{kind}:{os.path.splitext(os.path.basename(str(path).rstrip('/')))[0]}"
              for kind, path in specs]
    out = []
    for label in labels:
        n = out.count(label) + sum(o.startswith(label + "#") for o in out)
        out.append(label if n == 0 else f"{label}#{n + 1}")
    return out


def finite_or_none(value: Any) -> Any:
    """``value`` with NaN / inf floats as ``None`` (JSON has no NaN), recursively."""
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def flat_metrics(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``{"<label>/<metric>": value}`` for logs (TensorBoard, ``metrics.jsonl``)."""
    return {f"{label}/{name}": value for label, r in results.items()
            for name, value in r["metrics"].items()}


def format_results(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One block per evaluator: its file (and the retrieval queries dropped), then every
    metric (primary first), 4 decimals."""
    lines = []
    for label, r in results.items():
        dropped = r.get("dropped_queries")
        lines.append(f"{label} ({WHAT[r['kind']]}) on {r['file']}" + (
            f" ({dropped} queries without a relevant document dropped)"
            if dropped is not None else "") + ":")
        names = sorted(r["metrics"], key=lambda n: (n != r["primary_metric"], n))
        width = max(len(n) for n in names) if names else 0
        lines += [f"  {n:<{width}}  {r['metrics'][n]:.4f}" for n in names]
    return "\n".join(lines)
