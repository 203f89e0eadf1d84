"""``preprocess``: the command that tokenises a training corpus once into shard files.

Every package's CLI exposes it the same way (``dualcse-jax preprocess``, ``docent-jax
preprocess``)::

    dualcse-jax preprocess --config=CONFIG.py --output=DIR --num_shards=8
    dualcse-jax train --config=CONFIG.py --config.train_shards=DIR --workdir=RUN

The package supplies only a ``config -> CorpusSource`` (its token table, built a chunk at a
time); ``data_pipelines.sharded_corpus.write_corpus`` writes the shards and the manifest
(docs/data.md, "Sharded corpora").
"""

from __future__ import annotations

import os
from collections.abc import Callable

import ml_collections

COMMAND = "preprocess"
DEFAULT_NUM_SHARDS = 8
CHUNK_ROWS = 4096
"""Rows tokenised at a time: bounds the preprocessing memory, not the corpus size."""


def define_flags() -> None:
    """``--num_shards`` (the shared ``--output`` flag names the folder)."""
    from absl import flags

    flags.DEFINE_integer(
        "num_shards", DEFAULT_NUM_SHARDS, "preprocess: shard files to write; a multiple of "
        "the number of training hosts (each host reads num_shards / hosts of them).")


def run_preprocess(
    prog: str,
    make_source: Callable[[ml_collections.ConfigDict], object],
    config: ml_collections.ConfigDict,
    output: str | os.PathLike | None,
    num_shards: int,
    *,
    chunk_rows: int = CHUNK_ROWS,
):
    """Writes the corpus ``make_source(config)`` describes into ``output``, prints a summary.

    Args:
      prog: the command-line tool's name, for the summary.
      make_source: the package's ``config -> data_pipelines.sharded_corpus.CorpusSource``.
      config: the training config (data, model and max_length fields are read).
      output: a new or empty folder, local or ``gs://``.
      num_shards: shard files to write.
      chunk_rows: rows tokenised at a time.

    Returns:
      The written ``data_pipelines.shards.Manifest``.

    Raises:
      ValueError: no ``output``, a bad ``num_shards``, or bad data (file, line, field).
      FileExistsError: ``output`` is not a new or empty folder.
    """
    from data_pipelines.sharded_corpus import write_corpus

    if not output:
        raise ValueError(f"{COMMAND} needs --output=DIR (a new folder, local or gs://)")
    if int(num_shards) < 1:
        raise ValueError(f"--num_shards must be >= 1, got {num_shards}")
    manifest = write_corpus(make_source(config), output, num_shards=int(num_shards),
                            chunk_rows=chunk_rows)
    print(f"{prog} {COMMAND}: {manifest.num_rows} rows (fields {', '.join(manifest.fields)}; "
          f"max_length {manifest.max_length}) in {manifest.num_shards} shards under "
          f"{manifest.folder}\ntrain on them with --config.train_shards={manifest.folder}")
    return manifest
