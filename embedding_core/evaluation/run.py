"""Evaluation files named in ``config.eval_files`` or by the ``--ir/--sts/--pairs/--triplets``
flags of both CLIs: one :class:`Spec` each, parsed by :func:`parse`, run on any encoder
(``docs/evaluation.md``)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from embedding_core.storage import storage

KINDS = ("ir", "sts", "pairs", "triplets")
WHAT = {"ir": "retrieval", "sts": "similarity", "pairs": "pair classification",
        "triplets": "triplets"}
FLAG_HELP = {"ir": "a BEIR folder or JSON Lines of query/positive/negatives",
             "sts": "sentence1, sentence2, score (CSV or JSON Lines)",
             "pairs": "sentence1, sentence2, label 0/1 (CSV or JSON Lines)",
             "triplets": "anchor, positive, negative (CSV or JSON Lines)"}
DEFAULT_BATCH_SIZE = 32  # sentence-transformers' evaluators'; also config.eval_batch_size's
FIELD = "config.eval_files"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One evaluation file. ``label``: its results' key; ``source``: where it was given
    (``config.eval_files:`` or ``--KIND``), the start of its errors."""

    kind: str
    file: str
    label: str
    batch_size: int = DEFAULT_BATCH_SIZE
    split: str = "test"  # the BEIR qrels split of an ir folder
    source: str = ""


def split_field(text: str) -> list[str]:
    """``config.eval_files`` as ``KIND:PATH`` strings (``\\,`` is a comma in a path)."""
    parts = re.split(r"(?<!\\),", str(text or ""))
    return [p.strip().replace("\\,", ",") for p in parts if p.strip()]


def parse(given: str | Mapping[str, Sequence[str]], *, batch_size: int = DEFAULT_BATCH_SIZE,
          split: str = "test") -> list[Spec]:
    """Specs of ``config.eval_files`` or the CLIs' ``{kind: [path, ...]}``. Raises
    ValueError: no ``KIND:``, an unknown kind or no path."""
    field = isinstance(given, str)
    pairs = []
    for spec in split_field(given) if field else [f"{kind}:{path}" for kind in KINDS
                                                  for path in given.get(kind, ())]:
        kind, sep, path = spec.partition(":")
        kind, path = kind.strip(), path.strip()  # "sts: a.csv" is a.csv
        if not sep or kind not in KINDS or not path:
            raise ValueError(f"{FIELD}: " * field + f"evaluation {spec!r}: write KIND:PATH with "
                             f"KIND one of {KINDS} (ir:BEIR_DIR_OR_JSONL, sts:FILE, pairs:FILE, "
                             "triplets:FILE)" + "; a comma inside a path is written \\," * field)
        pairs.append((kind, path))
    return [Spec(kind, path, label, batch_size, split, f"{FIELD}:" if field else f"--{kind}")
            for (kind, path), label in zip(pairs, _labels(pairs), strict=True)]


def build(spec: Spec) -> Any:
    """The evaluator of ``spec``, its file read now. Raises FileNotFoundError, ValueError
    (a bucket, a folder where a file is read), DataError (a bad row)."""
    from embedding_core.errors import DataError
    from embedding_core.evaluation import pairs, retrieval

    kind, path, options = spec.kind, spec.file, {"batch_size": spec.batch_size}
    try:
        storage.check_not_bucket(path)
        where = storage.as_path(path)
        if not where.exists():
            raise FileNotFoundError(f"{storage.display(path)} does not exist")
        if kind == "ir":
            if where.is_dir():
                return retrieval.InformationRetrievalEvaluator.from_beir(
                    path, split=spec.split, **options)
            return retrieval.InformationRetrievalEvaluator.from_jsonl(path, **options)
        if where.is_dir():
            raise ValueError(f"{storage.display(path)} is a folder; {kind} reads one CSV or "
                             "JSON Lines file")
        return {"sts": pairs.EmbeddingSimilarityEvaluator,
                "pairs": pairs.BinaryClassificationEvaluator,
                "triplets": pairs.TripletEvaluator}[kind].from_file(path, **options)
    except DataError:
        raise
    except (FileNotFoundError, ValueError) as e:
        wrap = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
        raise wrap(f"{spec.source} {e}".lstrip()) from None


def build_all(specs: Iterable[Spec]) -> list[tuple[Spec, Any]]:
    """``(spec, evaluator)`` of every spec (:func:`build`), before any model loads."""
    return [(spec, build(spec)) for spec in specs]


class ViewOf:
    """An encoder with fixed keyword arguments on every encode (one view)."""

    def __init__(self, encoder: Any, kwargs: Mapping[str, Any]) -> None:
        self.encoder, self.kwargs = encoder, dict(kwargs)

    def encode(self, texts, **kwargs: Any):
        return self.encoder.encode(texts, **{**self.kwargs, **kwargs})

    def encode_query(self, texts, **kwargs: Any):
        return self.encoder.encode_query(texts, **{**self.kwargs, **kwargs})

    def encode_document(self, texts, **kwargs: Any):
        return self.encoder.encode_document(texts, **{**self.kwargs, **kwargs})


def view_of(encoder: Any, view: str | None) -> Any:
    """``encoder`` as its view ``view`` (``None``: as it is). Raises ValueError: a view
    the model lacks or that takes no texts."""
    if view is None:
        return encoder
    views = {v.name: v for v in getattr(encoder, "views", ()) if v.encode_kwargs is not None}
    if view not in views:
        raise ValueError(f"view {view!r}: {getattr(encoder, 'name', 'the model')} encodes "
                         f"texts as {sorted(views) or 'itself only (no --view)'}")
    return ViewOf(encoder, views[view].encode_kwargs)


def evaluate(encoder: Any, built: Iterable[tuple[Spec, Any]]) -> dict[str, dict[str, Any]]:
    """``{label: {"kind", "file", "primary_metric", "metrics", "dropped_queries"?}}``."""
    results = {}
    for spec, evaluator in built:
        metrics = {k: float(v) for k, v in evaluator(encoder).items()}
        results[spec.label] = {"kind": spec.kind, "file": storage.display(spec.file),
                               "primary_metric": evaluator.primary_metric, "metrics": metrics}
        if hasattr(evaluator, "dropped_queries"):
            results[spec.label]["dropped_queries"] = int(evaluator.dropped_queries)
    return results


def run_specs(specs: Sequence[Spec], load: Callable[[], Any], *, view: str | None = None,
              output: str | None = None, about: Callable[[Any], tuple[str, dict]],
              primary: bool = True) -> dict[str, dict[str, Any]]:
    """Both CLIs' ``evaluate --ir/...``: files read, ``load()``'s ``view`` scored; on the
    ``primary`` process printed and written to ``output`` with ``about(model)``'s record.
    Raises IsADirectoryError (before any work), and what :func:`build` and ``load`` raise."""
    from embedding_core.storage.files import write_json

    if output and storage.as_path(output).is_dir():
        raise IsADirectoryError(f"--output {output} is a folder; name a file")
    built = build_all(specs)
    model = load()
    results = evaluate(view_of(model, view), built)
    if primary:
        name, record = about(model)
        print(name + (f", view {view}" if view else ""))
        print(format_results(results))
        if output:
            write_json(storage.as_path(output), finite_or_none(
                {**record, "view": view, "results": results}))
            print(f"wrote {storage.display(output)}")
    return results


def _labels(specs: Sequence[tuple[str, str]]) -> list[str]:
    """The kind alone when once, else ``kind:stem``, numbered ``#2, #3`` on shared stems."""
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
    """One block per evaluator, primary metric first, 4 decimals."""
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
