"""``embedding-jax evaluate``: :func:`embedding_core.evaluation.run.run_specs` on any model
``load_encoder`` takes (hub id, folder, ``gs://``, our workdir, an export-hf folder)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from embedding_core.evaluation import run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax evaluate",
        description="Score a model on your own data with sentence-transformers' evaluators "
                    "and metric names (docs/evaluation.md). Paths may be gs://.")
    p.add_argument("--model", required=True, help="hub id org/name[@revision], a local or "
                   "gs:// model folder, an installed package, or a training workdir")
    for kind, what in run.FLAG_HELP.items():
        p.add_argument(f"--{kind}", action="append", default=[], help=f"{what}; may repeat")
    p.add_argument("--ir_split", default="test", help="the BEIR qrels split")
    p.add_argument("--view", default=None, help="a two-view model's view (DualCSE: explicit "
                   "or implicit; default: the model's own default)")
    p.add_argument("--batch_size", type=int, default=run.DEFAULT_BATCH_SIZE,
                   help="texts per encoder call")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not any(getattr(args, kind) for kind in run.KINDS):
        print("embedding-jax evaluate: error: give at least one of --ir, --sts, --pairs, "
              "--triplets", file=sys.stderr)
        return 2
    if args.batch_size < 1:
        print("embedding-jax evaluate: error: --batch_size must be >= 1", file=sys.stderr)
        return 2
    from embedding_core.serving.st_models import load_encoder
    from embedding_core.storage import storage

    try:
        specs = run.parse(vars(args), batch_size=args.batch_size, split=args.ir_split)
        # The trainers' start check: gs:// without credentials is one line, not a minute of
        # retries.
        storage.check_endpoint([args.model, args.output or "", *(s.file for s in specs)])
        run.run_specs(specs, lambda: load_encoder(args.model), view=args.view,
                      output=args.output, about=lambda model: (
                          getattr(model, "name", args.model), {"model": args.model}))
    except (OSError, ValueError) as err:
        print(f"embedding-jax evaluate: error: {err}", file=sys.stderr)
        return 1
    return 0
