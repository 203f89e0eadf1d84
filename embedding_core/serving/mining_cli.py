"""``embedding-jax mine-hard-negatives``: sentence-transformers' ``mine_hard_negatives`` over
a pairs file, written as a training file ``sentence-jax train`` reads (``docs/search.md``)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence

import numpy as np

from embedding_core.errors import DataError
from embedding_core.serving import mining
from embedding_core.storage import storage
from embedding_core.storage.files import check_not_an_input, write_text_atomic


def file_text(mined: mining.Mined, path: str) -> str:
    """``mined`` as CSV (a header, then rows) or JSON Lines (``.jsonl`` / ``.json``).
    Raises ValueError: labeled-list rows (lists) in a CSV, another suffix."""
    if path.endswith((".jsonl", ".json")):
        return "".join(json.dumps(dict(zip(mined.columns, row, strict=True)),
                                  ensure_ascii=False) + "\n" for row in mined.rows)
    if not path.endswith(".csv"):
        raise ValueError(f"--output={path}: give a .csv or .jsonl file")
    if mined.columns[-1] == "labels":
        raise ValueError(f"--output={path}: labeled-list rows hold lists, which CSV cannot; "
                         "write .jsonl")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(mined.columns)
    writer.writerows(mined.rows)
    return out.getvalue()


def run(args: argparse.Namespace) -> mining.Mined:
    """Reads, mines, writes ``args.output``. Raises FileNotFoundError, DataError,
    ValueError: one line naming the file; nothing written."""
    from embedding_core.distributed import multihost
    from embedding_core.serving.st_models import load_encoder
    from embedding_core.storage.text_lines import read_text_lines
    from sentence_jax.data import read_columns

    check_not_an_input(args.output, {"--pairs": args.pairs, "--corpus": args.corpus})
    pairs = read_columns(args.pairs, min_columns=2)
    anchors = [row[0] for row in pairs.texts]
    positives = [row[1] for row in pairs.texts]
    corpus = read_text_lines(args.corpus, "text", "--corpus") if args.corpus else None
    if args.output_format == "labeled-list" and not args.output.endswith((".jsonl", ".json")):
        raise ValueError(f"--output={args.output}: labeled-list rows hold lists; write .jsonl")
    file_text(mining.Mined(["a"], [], {}), args.output)  # the suffix, before any work
    encoder = load_encoder(args.model)
    encoder.use_local_devices()

    def encoding(method, prompt):
        def encode(texts: list[str]) -> np.ndarray:
            extra = {} if prompt is None else {"prompt": prompt}
            return np.asarray(method(texts, batch_size=args.batch_size,
                                     normalize_embeddings=True, **extra), np.float32)
        return encode

    mined = mining.mine_hard_negatives(
        anchors, positives, encoding(encoder.encode_query, args.query_prompt),
        encoding(encoder.encode_document, args.corpus_prompt), corpus=corpus,
        range_min=args.range_min, range_max=args.range_max, max_score=args.max_score,
        min_score=args.min_score, absolute_margin=args.absolute_margin,
        relative_margin=args.relative_margin, num_negatives=args.num_negatives,
        sampling_strategy=args.sampling_strategy, include_positives=args.include_positives,
        output_format=args.output_format, names=(pairs.names[0], pairs.names[1]),
        seed=args.seed)
    if not mined.rows:
        raise DataError(args.pairs, None, None, "no negatives were left after the filters; "
                        "nothing written (loosen the scores, margins or range)")
    if multihost.is_primary():
        write_text_atomic(args.output, file_text(mined, args.output))
    return mined


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax mine-hard-negatives",
        description="sentence-transformers' mine_hard_negatives (same arguments) with the "
                    "top-k search on the device mesh; writes a CSV or JSON Lines training file.")
    p.add_argument("--model", required=True, help="encoder (hub id, folder, package)")
    p.add_argument("--pairs", required=True, help="CSV / JSON Lines / Parquet: anchor, positive "
                   "(the first two text columns)")
    p.add_argument("--corpus", default=None, help="text file, one candidate a line (default: "
                   "the positives; the positives are always added)")
    p.add_argument("--output", required=True, help=".csv or .jsonl training file")
    p.add_argument("--range_min", type=int, default=0)
    p.add_argument("--range_max", type=int, default=None)
    p.add_argument("--max_score", type=float, default=None)
    p.add_argument("--min_score", type=float, default=None)
    p.add_argument("--absolute_margin", type=float, default=None)
    p.add_argument("--relative_margin", type=float, default=None)
    p.add_argument("--num_negatives", type=int, default=3)
    p.add_argument("--sampling_strategy", choices=mining.STRATEGIES, default="top")
    p.add_argument("--output_format", choices=mining.FORMATS, default="triplet")
    p.add_argument("--include_positives", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="random sampling's seed")
    p.add_argument("--query_prompt", default=None)
    p.add_argument("--corpus_prompt", default=None)
    p.add_argument("--batch_size", type=int, default=32, help="texts per encoder call")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seed < 0:
        print("embedding-jax mine-hard-negatives: error: --seed must be >= 0", file=sys.stderr)
        return 2
    try:
        mined = run(args)
    except (OSError, ValueError) as err:
        print(f"embedding-jax mine-hard-negatives: error: {storage.describe_error(err)}",
              file=sys.stderr)
        return 1
    skipped = ", ".join(f"{k} {v:,}" for k, v in mined.skipped.items() if v)
    print(f"mined {len(mined.rows):,} rows ({', '.join(mined.columns)}) into {args.output}"
          + (f"; candidates skipped: {skipped}" if skipped else ""), file=sys.stderr)
    return 0
