"""The ``embedding-jax`` console script: ``encode`` (``embedding_core.bulk_encode``) and
``evaluate`` (``embedding_core.evaluation.cli``)."""

from __future__ import annotations

import sys

USAGE = """usage: embedding-jax COMMAND [--help]

  encode    --model=NAME_OR_PATH --input=FILE_OR_GLOB --output=DIR   encode text files
  evaluate  --model=NAME_OR_PATH_OR_WORKDIR [--ir=DIR_OR_JSONL] [--sts=FILE]
            [--pairs=FILE] [--triplets=FILE] [--output=results.json]  score a model
"""


def run() -> None:
    """Dispatches ``embedding-jax COMMAND ...`` to the command's ``main``."""
    argv = sys.argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        sys.exit(0)
    if argv[:1] == ["encode"]:
        from embedding_core import bulk_encode

        sys.exit(bulk_encode.main(argv[1:]))
    if argv[:1] == ["evaluate"]:
        from embedding_core.evaluation import cli

        sys.exit(cli.main(argv[1:]))
    print(USAGE, end="", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    run()
