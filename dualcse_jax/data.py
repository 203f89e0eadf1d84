"""DualCSE's training data: the token table a config asks for and its resumable batches.

The tables and their field layout are built in ``data_pipelines.dualcse_data``; this module
picks the one a config describes (``train_data``, ``architecture``, ``max_length``,
``max_train_examples``) and batches it for ``embedding_core.run``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import ml_collections
import numpy as np

from data_pipelines import dualcse_data, inli, pipeline, snli


def train_table(config: ml_collections.ConfigDict, tokenizer) -> pipeline.TokenTable:
    """Tokenised training examples (cached per dataset and tokenizer).

    Raises:
      data_pipelines.errors.DataError: malformed training data (file, line, field).
    """
    if config.train_data == "snli":
        rows = snli.read_snli_triplets(snli.snli_triplets_path())
        table = dualcse_data.simcse_table_from_snli(rows, tokenizer, config.max_length)
    else:
        rows = inli.read_inli(inli.inli_split_path("train"))
        if config.architecture == "simcse":
            table = dualcse_data.simcse_table_from_inli(rows, tokenizer, config.max_length)
        else:
            table = dualcse_data.inli_table(rows, tokenizer, config.max_length,
                                            encoder=config.architecture)
    if config.max_train_examples:
        table = table.take(int(config.max_train_examples))
    return table


def batch_factory(config: ml_collections.ConfigDict, table: pipeline.TokenTable
                  ) -> Callable[[int], Iterator[dict[str, np.ndarray]]]:
    """``start_step -> this process's batches``: the order is a pure function of
    (``seed``, step), premises and hypotheses padded apart when ``group_padding``."""
    groups = dualcse_data.length_groups(config.architecture) if config.group_padding else None

    def make(start_step: int):
        return pipeline.make_batches(
            table, global_batch_size=int(config.batch_size), seed=int(config.seed),
            start_step=start_step, process_index=jax.process_index(),
            process_count=jax.process_count(), pad_multiple=int(config.pad_multiple),
            length_groups=groups)

    return make
