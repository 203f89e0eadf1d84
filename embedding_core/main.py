"""The ``embedding-jax`` console script: ``encode`` (``embedding_core.serving.bulk_encode``),
``evaluate`` (``embedding_core.evaluation.cli``), ``search`` and ``mine-hard-negatives``
(``serving.search_cli``, ``serving.mining_cli``), ``quantize`` and ``index`` (``serving.quantize``,
``serving.index``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: embedding-jax COMMAND [--help]

  encode    --model=NAME_OR_PATH --input=FILE_OR_GLOB --output=DIR   encode text files
            [--precision=int8|uint8|binary|ubinary [--calibration=EXPORT_OR_NPY]]
  quantize  --input=EXPORT --output=DIR --precision=int8|uint8|binary|ubinary
            [--calibration=EXPORT_OR_NPY]                           quantize an export
  index     --input=EXPORT --output=FILE --kind=flat|ivf|hnsw|binary-flat|usearch
            [--float=EXPORT]                 a faiss/usearch index, with its recall@10
  evaluate  --model=NAME_OR_PATH_OR_WORKDIR [--ir=DIR_OR_JSONL] [--sts=FILE]
            [--pairs=FILE] [--triplets=FILE] [--output=results.json]  score a model
  search    --corpus=EXPORT_DIR --queries=EXPORT_DIR_OR_FILE [--model=NAME_OR_PATH]
            --output=run.jsonl|run.trec [--top_k=10] [--score=cos|dot] [--qrels=FILE]
                                                           exact top-k over the devices
  mine-hard-negatives --model=NAME_OR_PATH --pairs=FILE --output=FILE [--corpus=FILE]
            [--num_negatives=3] [--output_format=triplet|n-tuple|labeled-pair|labeled-list]
                                       hard negatives as sentence-transformers mines them
"""


def _gs_values(argv: Sequence[str]) -> list[str]:
    """The ``gs://`` values of ``--flag=VALUE`` / ``--flag VALUE`` arguments."""
    values = [a.split("=", 1)[1] if a.startswith("-") and "=" in a else a for a in argv]
    return [part for v in values for part in v.split(",") if part.startswith("gs://")]


def check_storage(command: str, argv: Sequence[str]) -> int:
    """``storage.check_endpoint`` of a command line's ``gs://`` URIs: 0, or 1 after one
    line on stderr."""
    uris = _gs_values(argv)
    if not uris:
        return 0
    from embedding_core.storage import storage

    try:
        storage.check_endpoint(uris)
    except (OSError, ValueError) as err:
        print(f"embedding-jax {command}: error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str]) -> int:
    """``embedding-jax COMMAND ...`` (without the program name); the exit status."""
    argv = list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    if argv[:1] == ["encode"]:
        from embedding_core.serving import bulk_encode

        return check_storage("encode", argv[1:]) or bulk_encode.main(argv[1:])
    if argv[:1] in (["quantize"], ["index"]):
        from embedding_core.serving import index, quantize

        run = quantize.main if argv[0] == "quantize" else index.main
        return check_storage(argv[0], argv[1:]) or run(argv[1:])
    if argv[:1] == ["evaluate"]:
        from embedding_core.evaluation import cli

        return cli.main(argv[1:])  # runs the same check itself
    if argv[:1] == ["search"]:
        from embedding_core.serving import search_cli

        return check_storage("search", argv[1:]) or search_cli.main(argv[1:])
    if argv[:1] == ["mine-hard-negatives"]:
        from embedding_core.serving import mining_cli

        return check_storage("mine-hard-negatives", argv[1:]) or mining_cli.main(argv[1:])
    print(USAGE, end="", file=sys.stderr)
    return 2


def run() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run()
