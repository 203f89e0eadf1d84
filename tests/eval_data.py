"""Small evaluation files in each evaluator's format, made from the shipped INLI test rows
(tests of ``embedding-jax evaluate`` and ``--config.eval_files``).

STS scoring, stated: explicit entailment 5, implied 4, neutral 2, contradiction 0.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_eval_files(folder: Path, rows: int = 12) -> dict[str, Path]:
    """``{"ir", "sts", "pairs", "triplets": path}``, JSON Lines, from ``rows`` INLI rows."""
    from data_pipelines import inli

    examples = inli.read_inli(inli.inli_split_path("test"))[:rows]
    folder.mkdir(parents=True, exist_ok=True)
    records = {
        "ir": [{"query": e.premise, "positive": e.implied_entailment,
                "negatives": [e.contradiction, e.neutral]} for e in examples],
        "sts": [{"sentence1": e.premise, "sentence2": h, "score": s} for e in examples
                for h, s in ((e.explicit_entailment, 5), (e.implied_entailment, 4),
                             (e.neutral, 2), (e.contradiction, 0))],
        "pairs": [{"sentence1": e.premise, "sentence2": h, "label": y} for e in examples
                  for h, y in ((e.implied_entailment, 1), (e.contradiction, 0),
                               (e.neutral, 0))],
        "triplets": [{"anchor": e.premise, "positive": e.implied_entailment,
                      "negative": e.contradiction} for e in examples],
    }
    paths = {}
    for kind, rows_of in records.items():
        paths[kind] = folder / f"{kind}.jsonl"
        paths[kind].write_text("".join(json.dumps(r) + "\n" for r in rows_of))
    return paths
