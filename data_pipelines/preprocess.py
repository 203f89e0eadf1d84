"""``PROG preprocess``: tokenise a training corpus once into shards (docs/data.md, "Sharded
corpora")."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib import import_module

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


def command(data_module: str, help_text: str, data_paths: Sequence[str] = ()):
    """The CLI's ``preprocess``: writes ``data_module.corpus_source(config)``."""
    from embedding_core.commands import Command
    from embedding_core.storage import storage

    def run(inv):
        config = storage.absolute_data_paths(inv.config, data_paths) if data_paths else inv.config
        return run_preprocess(inv.prog, import_module(data_module).corpus_source, config,
                              inv.flags.output, inv.flags.num_shards)

    return Command(COMMAND, run, f"--config=CONFIG.py --output=DIR "
                   f"[--num_shards={DEFAULT_NUM_SHARDS}]", help_text, needs_workdir=False)


def run_preprocess(
    prog: str,
    make_source: Callable[[ml_collections.ConfigDict], object],
    config: ml_collections.ConfigDict,
    output: str | os.PathLike | None,
    num_shards: int,
    *,
    chunk_rows: int = CHUNK_ROWS,
):
    """Writes ``make_source(config)`` into a new or empty ``output``, prints a summary, returns
    the manifest; ValueError: no output, bad ``num_shards``, bad data; FileExistsError."""
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
