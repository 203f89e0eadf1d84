"""``embedding-jax evaluate``: the evaluators of ``embedding_core.evaluation.run`` on any
model ``load_encoder`` takes (hub id, folder, ``gs://``, our workdir, an export-hf folder)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax evaluate",
        description="Score a model on your own data with sentence-transformers' evaluators "
                    "and metric names (docs/evaluation.md). Paths may be gs://.")
    p.add_argument("--model", required=True, help="hub id org/name[@revision], a local or "
                   "gs:// model folder, an installed package, or a training workdir")
    p.add_argument("--ir", action="append", default=[], help="retrieval: a BEIR folder "
                   "(corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) or JSON Lines of "
                   '{"query", "positive", ["negatives"]}; may repeat')
    p.add_argument("--ir_split", default="test", help="the BEIR qrels split")
    p.add_argument("--sts", action="append", default=[], help="CSV or JSON Lines of "
                   "sentence1, sentence2, score: Pearson and Spearman; may repeat")
    p.add_argument("--pairs", action="append", default=[], help="CSV or JSON Lines of "
                   "sentence1, sentence2, label (0/1): accuracy, F1, AP at the best "
                   "thresholds; may repeat")
    p.add_argument("--triplets", action="append", default=[], help="CSV or JSON Lines of "
                   "anchor, positive, negative: accuracy; may repeat")
    p.add_argument("--view", default=None, help="a two-view model's view (DualCSE: explicit "
                   "or implicit; default: the model's own default)")
    p.add_argument("--batch_size", type=int, default=32, help="texts per encoder call")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    return p


def specs_of(args: argparse.Namespace) -> list[str]:
    return [f"{kind}:{path}" for kind in ("ir", "sts", "pairs", "triplets")
            for path in getattr(args, kind)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    specs = specs_of(args)
    if not specs:
        print("embedding-jax evaluate: error: give at least one of --ir, --sts, --pairs, "
              "--triplets", file=sys.stderr)
        return 2
    from embedding_core.evaluation import run
    from embedding_core.serving.st_models import load_encoder
    from embedding_core.storage import storage
    from embedding_core.storage.files import write_json

    if args.batch_size < 1:
        print("embedding-jax evaluate: error: --batch_size must be >= 1", file=sys.stderr)
        return 2
    try:
        # The trainers' start check: gs:// without credentials is one line, not a minute of
        # retries.
        storage.check_endpoint([args.model, args.output or "",
                                *(path for _, path in map(run.parse_spec, specs))])
        if args.output:  # before any work: a result that cannot be written is lost
            out = storage.as_path(args.output)
            if out.is_dir():
                raise IsADirectoryError(f"--output {args.output} is a folder; name a file")
        built = run.build_flags(specs, batch_size=args.batch_size, ir_split=args.ir_split)
        model = load_encoder(args.model)
        results = run.evaluate(run.view_of(model, args.view), (), evaluators=built)
        print(f"{getattr(model, 'name', args.model)}"
              + (f", view {args.view}" if args.view else ""))
        print(run.format_results(results))
        if args.output:
            write_json(out, run.finite_or_none(
                {"model": args.model, "view": args.view, "results": results}))
            print(f"wrote {storage.display(args.output)}")
    except (OSError, ValueError) as err:
        print(f"embedding-jax evaluate: error: {err}", file=sys.stderr)
        return 1
    return 0
