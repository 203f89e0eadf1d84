"""DualCSE's batches, training rows and RTE sets (``val_file`` / ``test_file``, else INLI)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import ml_collections
import numpy as np

from data_pipelines import inli, sentence_files, sharded_corpus, shards, snli
from data_pipelines.table import TokenTable
from dualcse_jax import tables
from embedding_core import BatchField

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
GROUPED_INPUTS = tuple(tuple(f"{name}_{g}" for g in (0, 1)) for name in INPUTS)
"""With ``group_padding``: each input per ``tables.length_groups`` group."""


def batch_spec(config: ml_collections.ConfigDict) -> dict[str, BatchField]:
    """Inputs ``[batch, F(_g), seq(_g)]`` int32 (per ``group_padding`` group), ``text_ids``."""
    names = GROUPED_INPUTS if config.group_padding else tuple((n,) for n in INPUTS)
    spec = {name: BatchField("int", ("batch", f"fields{g}", f"seq{g}"))
            for group in names for g, name in enumerate(group)}
    spec["text_ids"] = BatchField("int", ("batch", len(tables.FIELDS[config.architecture])))
    return spec


def model_inputs(batch) -> tuple:
    """``(input_ids, attention_mask, token_type_ids)``: arrays, or tuples per group."""
    if "input_ids" in batch:
        return tuple(batch[n] for n in INPUTS)
    return tuple(tuple(batch[n] for n in group) for group in GROUPED_INPUTS)


def _field(config: ml_collections.ConfigDict, name: str) -> str:
    return str(config.get(name, "") or "").strip()  # .get: older runs lack the field


def has_own_file(config: ml_collections.ConfigDict, name: str) -> bool:
    return bool(_field(config, name))


def train_source(config: ml_collections.ConfigDict) -> str:
    """What the run trains on, for messages."""
    if _field(config, "train_shards"):
        return f"shards of {_field(config, 'train_shards')}"
    return _field(config, "train_file") or f"shipped {config.train_data} train"


def _own_table(config: ml_collections.ConfigDict, tokenizer, path: str) -> TokenTable:
    if config.architecture == "simcse":
        pairs = sentence_files.read_anchor_pairs(path)
        # A row without a hard negative repeats its positive there: simcse_loss drops a hard
        # negative that is its own row's positive, so that row has in-batch negatives only.
        return tables.simcse_table(
            [p.anchor for p in pairs], [p.positive for p in pairs],
            [p.hard_negative or p.positive for p in pairs], tokenizer, config.max_length)
    rows = sentence_files.read_inli_file(path)
    return tables.inli_table(rows, tokenizer, config.max_length, encoder=config.architecture)


def train_table(config: ml_collections.ConfigDict, tokenizer) -> TokenTable:
    """Tokenised ``train_file`` (cross/bi: ``premise, explicit_entailment, implied_entailment,
    contradiction[, neutral]``; simcse: ``anchor, positive[, hard_negative]``), else shipped
    ``train_data``; FileNotFoundError, DataError."""
    if _field(config, "train_file"):
        table = _own_table(config, tokenizer, _field(config, "train_file"))
    elif config.train_data == "snli":
        rows = snli.read_snli_triplets(snli.snli_triplets_path())
        table = tables.simcse_table_from_snli(rows, tokenizer, config.max_length)
    else:
        rows = inli.read_inli(inli.inli_split_path("train"))
        if config.architecture == "simcse":
            table = tables.simcse_table_from_inli(rows, tokenizer, config.max_length)
        else:
            table = tables.inli_table(rows, tokenizer, config.max_length,
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
    """RTE's threshold rows: ``val_file``, else INLI val; FileNotFoundError, DataError."""
    return _rte_examples(config, "val")


def test_examples(config: ml_collections.ConfigDict) -> list[inli.INLIExample]:
    """RTE's report rows: ``test_file``, else INLI test (errors as :func:`val_examples`)."""
    return _rte_examples(config, "test")


def test_source(config: ml_collections.ConfigDict) -> str:
    """``test_file``, else ``INLI test``."""
    return _field(config, "test_file") or "INLI test"


def rte_sets_label(config: ml_collections.ConfigDict) -> str:
    """``"<test set>, threshold tuned on <val set>"``."""
    val = _field(config, "val_file") or "INLI val"
    return f"{test_source(config)}, threshold tuned on {val}"


def batch_factory(config: ml_collections.ConfigDict, table: TokenTable | shards.Manifest
                  ) -> Callable[[int], Iterator[dict[str, np.ndarray]]]:
    """``start_step -> this process's batches``, a pure function of (``seed``, step)."""
    groups = tables.length_groups(config.architecture) if config.group_padding else None

    def make(start_step: int):
        from data_pipelines.pipeline import make_batches  # loads TensorFlow

        return make_batches(
            table, global_batch_size=int(config.batch_size), seed=int(config.seed),
            start_step=start_step, process_index=jax.process_index(),
            process_count=jax.process_count(), pad_multiple=int(config.pad_multiple),
            length_groups=groups)

    return make


def train_rows(config: ml_collections.ConfigDict, tokenizer, model_dir
               ) -> TokenTable | shards.Manifest:
    """``train_shards``'s corpus (checked against fields, ``max_length``, tokenizer), else
    :func:`train_table`; FileNotFoundError, ValueError (field named), DataError."""
    folder = _field(config, "train_shards")
    if folder:
        return sharded_corpus.open_corpus(
            folder, fields=tables.FIELDS[config.architecture],
            max_length=int(config.max_length), model_dir=model_dir)
    return train_table(config, tokenizer)


def corpus_source(config: ml_collections.ConfigDict) -> sharded_corpus.CorpusSource:
    """What ``dualcse-jax preprocess`` writes; FileNotFoundError, DataError."""
    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.models.pretrained import resolve_model_dir

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
