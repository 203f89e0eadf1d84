"""DualCSE's data: the token table a config asks for, its resumable batches, the RTE sets.

The tables and their field layout are built in ``data_pipelines.dualcse_data``; this module
picks the one a config describes (``train_file`` or ``train_data``, ``architecture``,
``max_length``, ``max_train_examples``) and batches it for ``embedding_core.run``.
``train_file`` (the user's own CSV or JSON Lines, ``data_pipelines.sentence_files``) replaces
``train_data`` when set. RTE tunes its threshold on ``val_file`` (else shipped INLI val) and
reports on ``test_file`` (else shipped INLI test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import ml_collections
import numpy as np

from data_pipelines import (
    dualcse_data,
    inli,
    pipeline,
    sentence_files,
    sharded_corpus,
    shards,
    snli,
)


def _field(config: ml_collections.ConfigDict, name: str) -> str:
    # .get: a run saved before the field existed still loads.
    return str(config.get(name, "") or "").strip()


def has_own_file(config: ml_collections.ConfigDict, name: str) -> bool:
    """Whether the config names a user file in field ``name`` (``val_file``...)."""
    return bool(_field(config, name))


def train_source(config: ml_collections.ConfigDict) -> str:
    """What the run trains on, for logs and messages: the shards folder
    (``"shards of gs://b/corpus"``), else the train file, else the shipped ``train_data``
    (``"shipped inli train"``)."""
    if _field(config, "train_shards"):
        return f"shards of {_field(config, 'train_shards')}"
    return _field(config, "train_file") or f"shipped {config.train_data} train"


def _own_table(config: ml_collections.ConfigDict, tokenizer, path: str) -> pipeline.TokenTable:
    if config.architecture == "simcse":
        pairs = sentence_files.read_anchor_pairs(path)
        # A row without a hard negative repeats its positive there: simcse_loss drops a hard
        # negative that is its own row's positive, so that row has in-batch negatives only.
        return dualcse_data.simcse_table(
            [p.anchor for p in pairs], [p.positive for p in pairs],
            [p.hard_negative or p.positive for p in pairs], tokenizer, config.max_length)
    rows = sentence_files.read_inli_file(path)
    return dualcse_data.inli_table(rows, tokenizer, config.max_length,
                                   encoder=config.architecture)


def train_table(config: ml_collections.ConfigDict, tokenizer) -> pipeline.TokenTable:
    """Tokenised training examples (cached per dataset and tokenizer).

    ``config.train_file`` set: the user's file, ``premise, explicit_entailment,
    implied_entailment, contradiction[, neutral]`` for cross/bi, ``anchor, positive[,
    hard_negative]`` for simcse (``data_pipelines.sentence_files``); else the shipped
    ``config.train_data``.

    Raises:
      FileNotFoundError: ``train_file`` does not exist.
      data_pipelines.errors.DataError: malformed training data (file, line, field).
    """
    if _field(config, "train_file"):
        table = _own_table(config, tokenizer, _field(config, "train_file"))
    elif config.train_data == "snli":
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


def _rte_examples(config: ml_collections.ConfigDict, split: str) -> list[inli.INLIExample]:
    path = _field(config, f"{split}_file")
    if path:
        return sentence_files.read_inli_file(path, require_neutral=True)
    return inli.read_inli(inli.inli_split_path(split))


def val_examples(config: ml_collections.ConfigDict) -> list[inli.INLIExample]:
    """The rows RTE tunes its threshold on: ``config.val_file``, else shipped INLI val.

    Raises:
      FileNotFoundError: the file does not exist.
      data_pipelines.errors.DataError: a malformed row; a user file needs ``neutral`` too.
    """
    return _rte_examples(config, "val")


def test_examples(config: ml_collections.ConfigDict) -> list[inli.INLIExample]:
    """The rows RTE reports on: ``config.test_file``, else shipped INLI test.

    Raises:
      FileNotFoundError: the file does not exist.
      data_pipelines.errors.DataError: a malformed row; a user file needs ``neutral`` too.
    """
    return _rte_examples(config, "test")


def rte_sets_label(config: ml_collections.ConfigDict) -> str:
    """``"<test set>, threshold tuned on <val set>"`` for printed tables."""
    test = _field(config, "test_file") or "INLI test"
    val = _field(config, "val_file") or "INLI val"
    return f"{test}, threshold tuned on {val}"


def batch_factory(config: ml_collections.ConfigDict,
                  table: pipeline.TokenTable | shards.Manifest
                  ) -> Callable[[int], Iterator[dict[str, np.ndarray]]]:
    """``start_step -> this process's batches``: the order is a pure function of
    (``seed``, step), premises and hypotheses padded apart when ``group_padding``; a
    sharded corpus (:func:`train_rows`) is streamed, each host reading its own shards."""
    groups = dualcse_data.length_groups(config.architecture) if config.group_padding else None

    def make(start_step: int):
        return sharded_corpus.batches_of(
            table, global_batch_size=int(config.batch_size), seed=int(config.seed),
            start_step=start_step, process_index=jax.process_index(),
            process_count=jax.process_count(), pad_multiple=int(config.pad_multiple),
            length_groups=groups)

    return make


def train_rows(config: ml_collections.ConfigDict, tokenizer, model_dir
               ) -> pipeline.TokenTable | shards.Manifest:
    """The training rows: the sharded corpus of ``config.train_shards`` when set (streamed
    by :func:`batch_factory`; its manifest must match the architecture's fields,
    ``max_length`` and the model's tokenizer), else :func:`train_table` in memory.

    Raises:
      FileNotFoundError: no corpus at ``train_shards``.
      ValueError: a corpus preprocessed for other settings (manifest and field named).
      data_pipelines.errors.DataError: malformed training data (file, line, field).
    """
    folder = str(config.get("train_shards", "") or "").strip()
    if folder:
        return sharded_corpus.open_corpus(
            folder, fields=dualcse_data.FIELDS[config.architecture],
            max_length=int(config.max_length), model_dir=model_dir)
    return train_table(config, tokenizer)


def corpus_source(config: ml_collections.ConfigDict) -> sharded_corpus.CorpusSource:
    """What ``dualcse-jax preprocess`` writes: the rows :func:`train_table` builds for this
    config (text identities span the whole data, so the table is built whole and written a
    chunk at a time).

    Raises:
      FileNotFoundError: no model or data file. DataError: malformed training data.
    """
    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.pretrained import resolve_model_dir

    model_dir = resolve_model_dir(config.model)
    tokenizer_json, pad_id = sharded_corpus.tokenizer_files(model_dir)
    table = train_table(config, load_tokenizer(model_dir))
    source = {"train": train_source(config), "architecture": config.architecture,
              "max_length": int(config.max_length), "model": str(config.model),
              "max_train_examples": int(config.max_train_examples)}
    return sharded_corpus.CorpusSource(
        fields=table.field_names, max_length=table.max_len, num_rows=table.num_examples,
        rows=sharded_corpus.table_rows(table), tokenizer_json=tokenizer_json,
        tokenizer=str(config.model), pad_id=pad_id, source=source,
        description=f"DualCSE-{config.architecture} training rows of {train_source(config)}")
