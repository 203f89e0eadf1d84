"""``embedding-jax search``: exact top-k of queries (a text file encoded by ``--model``, or an
export) against an exported corpus; JSON Lines or TREC run, optionally scored against BEIR
qrels (``docs/search.md``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embedding_core.distributed import arguments
from embedding_core.errors import DataError
from embedding_core.storage import storage
from embedding_core.storage.files import check_not_an_input, write_text_atomic

# The evaluator's cutoffs (sentence-transformers' defaults); only those <= --top_k are
# printed, as a run of k hits cannot give a metric at a deeper cutoff.
CUTOFFS = {"accuracy_at_k": (1, 3, 5, 10), "precision_recall_at_k": (1, 3, 5, 10),
           "mrr_at_k": (10,), "ndcg_at_k": (10,), "map_at_k": (100,)}


def read_queries(path: str, model: str | None, batch_size: int
                 ) -> tuple[list[str], np.ndarray]:
    """``(query ids, [n, dim] float32)``: an export folder (its ``ids.txt``), or with
    ``model`` a text file (ids: 1-based line numbers) or BEIR ``queries.jsonl`` (``_id``,
    ``text``) encoded by ``encode_query``. Raises FileNotFoundError, DataError, ValueError."""
    from embedding_core.serving import search

    where = storage.as_path(path)
    if where.is_dir():
        corpus = search.Corpus(path)
        vectors = np.concatenate([c for _, c in corpus.chunks(max(corpus.num_rows, 1))])
        return corpus.all_ids(), vectors
    if model is None:
        raise ValueError(f"--queries={path} is a file: give --model=NAME_OR_PATH to encode "
                         "it (or an export folder of query vectors)")
    if path.endswith(".jsonl"):
        from embedding_core.evaluation import retrieval

        texts = retrieval._ids(where, lambda r, line: retrieval._text(r, "text", where, line))
        if not texts:
            raise DataError(path, None, None, "no query in file")
        ids, values = list(texts), list(texts.values())
    else:
        from embedding_core.storage.text_lines import read_text_lines

        values = read_text_lines(path, "query", "--queries")
        ids = [str(i) for i in range(1, len(values) + 1)]
    from embedding_core.serving.st_models import load_encoder

    encoder = load_encoder(model)
    encoder.use_local_devices()
    return ids, np.asarray(encoder.encode_query(values, batch_size=batch_size), np.float32)


def read_qrels(path: str, query_ids: Sequence[str], corpus_ids: Sequence[str]
               ) -> dict[str, dict[str, int]]:
    """BEIR ``qrels/*.tsv`` (header ``query-id corpus-id score``) as ``{query: {doc:
    grade}}``, grades > 0 kept. Raises DataError: a bad row, an id the run does not know."""
    from embedding_core.evaluation import retrieval

    where = storage.as_path(path)
    if not where.is_file():
        raise FileNotFoundError(f"--qrels={path} does not exist")
    relevant = retrieval.read_qrels(where, set(query_ids), set(corpus_ids))
    if not relevant:
        raise DataError(path, None, None, "no row with a score above 0: no query of the run "
                        "has a relevant document")
    return relevant


def score_run(rows: np.ndarray, query_ids: Sequence[str], corpus_ids: Sequence[str],
              relevant: dict[str, dict[str, int]]) -> dict[str, float]:
    """The retrieval evaluator's metrics of a run (``rows`` ``[n, k]`` corpus rows, best
    first) at the cutoffs <= k; queries without a relevant document are dropped, as there."""
    from embedding_core.evaluation.retrieval import InformationRetrievalEvaluator

    k = rows.shape[1]
    cutoffs = {name: [c for c in cs if c <= k] or [k] for name, cs in CUTOFFS.items()}
    evaluator = InformationRetrievalEvaluator(
        dict(zip(query_ids, query_ids, strict=True)), dict.fromkeys(corpus_ids, ""), relevant,
        **cutoffs)
    position = {q: i for i, q in enumerate(query_ids)}
    return evaluator.compute_metrics(rows[[position[q] for q in evaluator.query_ids]])


def run_text(fmt: str, query_ids: Sequence[str], corpus_ids: Mapping[int, str] | Sequence[str],
             scores: np.ndarray, rows: np.ndarray, run_name: str) -> str:
    """The run as JSON Lines (``{"query_id", "hits": [{"corpus_id", "score"}]}``) or TREC
    (``qid Q0 docid rank score run_name``); ``corpus_ids[row]`` names a hit."""
    out = []
    for qid, s, r in zip(query_ids, scores.tolist(), rows.tolist(), strict=True):
        if fmt == "trec":
            out.extend(f"{qid} Q0 {corpus_ids[j]} {rank} {v:.6f} {run_name}\n"
                       for rank, (j, v) in enumerate(zip(r, s, strict=True), 1))
        else:
            out.append(json.dumps({"query_id": qid, "hits": [
                {"corpus_id": corpus_ids[j], "score": v} for j, v in zip(r, s, strict=True)]},
                ensure_ascii=False) + "\n")
    return "".join(out)


def _check_trec_id(ids: Sequence[str], what: str) -> None:
    bad = next((i for i in ids if not i or any(c.isspace() for c in i)), None)
    if bad is not None:
        raise ValueError(f"{what}: id {bad!r} is empty or holds white space, which a TREC "
                         "run cannot hold; write JSON Lines instead")


def run_search(args: argparse.Namespace) -> dict[str, Any]:
    """Searches, writes ``args.output``; returns ``{"queries", "metrics"}``. Raises
    FileNotFoundError, DataError, ValueError: one line naming the file; nothing written."""
    from embedding_core.distributed import multihost
    from embedding_core.serving import search

    fmt = args.format or ("trec" if args.output.endswith(".trec") else "jsonl")
    check_not_an_input(args.output, {"--corpus": args.corpus, "--queries": args.queries,
                                     "--qrels": args.qrels})
    corpus = search.Corpus(args.corpus)
    if args.top_k > corpus.num_rows:
        # Refused, not clamped as sentence-transformers does: a run shorter than asked
        # would silently give metrics at cutoffs it cannot reach.
        raise ValueError(f"--corpus={args.corpus}: --top_k={args.top_k} is larger than the "
                         f"corpus ({corpus.num_rows} rows); give --top_k <= {corpus.num_rows}")
    query_ids, queries = read_queries(args.queries, args.model, args.batch_size)
    if queries.shape[1] != corpus.dim:
        raise ValueError(f"--corpus={args.corpus}: rows of dimension {corpus.dim}, but the "
                         f"queries ({args.queries}) have {queries.shape[1]}")
    if fmt == "trec":
        _check_trec_id(query_ids, f"--queries={args.queries}")
    # Every corpus id only to score against qrels; a run alone reads those of its hits.
    all_ids = corpus.all_ids() if args.qrels else None
    relevant = read_qrels(args.qrels, query_ids, all_ids) if args.qrels else None
    scores, rows = search.search(queries, corpus, args.top_k, score=args.score,
                                 chunk_rows=args.chunk_rows, row_block=args.row_block,
                                 query_batch=args.query_batch)
    metrics = score_run(rows, query_ids, all_ids, relevant) if relevant is not None else None
    hit_ids = all_ids if all_ids is not None else corpus.ids_of(rows)
    if fmt == "trec":
        _check_trec_id([hit_ids[j] for j in np.unique(rows).tolist()],
                       f"--corpus={args.corpus}")
    if multihost.is_primary():
        write_text_atomic(args.output, run_text(fmt, query_ids, hit_ids, scores, rows,
                                                args.run_name))
    return {"queries": len(query_ids), "metrics": metrics}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax search",
        description="Exact top-k search of queries against an exported corpus, the corpus "
                    "streamed in row chunks over the devices (and the processes).")
    p.add_argument("--corpus", required=True, help="export folder of the corpus vectors (an "
                   "array folder or a multi-part manifest; local or gs://)")
    p.add_argument("--queries", required=True, help="an export folder of query vectors, or "
                   "with --model a text file (one query a line; ids = line numbers) or BEIR "
                   "queries.jsonl")
    p.add_argument("--model", default=None, help="encoder of the query file (hub id, folder, "
                   "package), as embedding-jax encode takes it")
    p.add_argument("--output", required=True, help="run file: JSON Lines, or TREC when it "
                   "ends in .trec or with --format=trec")
    p.add_argument("--format", choices=("jsonl", "trec"), default=None)
    p.add_argument("--top_k", type=int, default=10, help="hits a query (refused above the "
                   "corpus size)")
    p.add_argument("--score", choices=("cos", "dot"), default="cos")
    p.add_argument("--qrels", default=None, help="BEIR qrels .tsv: print the retrieval "
                   "metrics of the run")
    p.add_argument("--run_name", default="embedding-jax", help="TREC run name")
    p.add_argument("--batch_size", type=int, default=256, help="texts per encoder call")
    p.add_argument("--chunk_rows", type=int, default=65536,
                   help="corpus rows read and ranked at a time")
    p.add_argument("--row_block", type=int, default=8192,
                   help="rows scored at once on a device (0: its whole share of a chunk)")
    p.add_argument("--query_batch", type=int, default=1024, help="queries ranked at once")
    arguments.add_coordinator_arguments(p, ", and ranks its share of the chunks, process 0 writes")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.top_k, args.batch_size, args.chunk_rows, args.query_batch) < 1 or \
            args.row_block < 0 or not args.run_name or any(c.isspace() for c in args.run_name):
        print("embedding-jax search: error: --top_k, --batch_size, --chunk_rows and "
              "--query_batch must be >= 1, --row_block >= 0, --run_name one word",
              file=sys.stderr)
        return 2
    arguments.initialize_from_arguments(args)
    try:
        done = run_search(args)
    except (OSError, ValueError) as err:
        print(f"embedding-jax search: error: {storage.describe_error(err)}", file=sys.stderr)
        return 1
    print(f"searched {done['queries']:,} queries (top {args.top_k}) into {args.output}",
          file=sys.stderr)
    for name, value in (done["metrics"] or {}).items():
        print(f"{name}: {value:.4f}")
    return 0
