"""DocEnt's batch contract (:data:`BATCH`, per variant) and rows: one per (entity, sentence)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import ml_collections
import numpy as np
from tokenizers import Tokenizer

from data_pipelines import sharded_corpus, shards
from data_pipelines.errors import DataError
from data_pipelines.table import TokenTable, stack_fields
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached
from docent_jax.corpus import (
    ENTITY_IDS_FILE,
    EntityData,
    check_entity_ids,
    own_entity_data,
    read_entity_ids,
    squad_entity_data,
    with_queries_file,
)
from docent_jax.masking import ENTITY_POSITION
from embedding_core import BatchField
from embedding_core.storage import storage

FIELD = "sentence"
TOKENS = ("input_ids", "attention_mask", "token_type_ids")
_ENTITY = {"entity_ids": BatchField("int", ("batch",))}
BATCH = {
    # Dual: one field (the sentence) per row, as the generic pipeline yields it.
    "dual": {**{k: BatchField("int", ("batch", 1, "seq")) for k in TOKENS}, **_ENTITY},
    # Hybrid: the sentence alone; Full: [CLS] <entity> [SEP] sentence [SEP] (seq = L + 2).
    "hybrid": {**{k: BatchField("int", ("batch", "seq")) for k in TOKENS}, **_ENTITY},
    "full": {**{k: BatchField("int", ("batch", "seq")) for k in TOKENS}, **_ENTITY},
}
"""Each variant's host batch (int32); ``step`` rides along (checked by the loop)."""
WARMUP = {"mlm_warmup": BatchField("float", ("batch",))}
"""Added during a head-only warm-up: 1.0 in its steps (``optimizer.head_warmup_steps``)."""
CORPUS_ENTITIES = "entities.json"
"""A preprocessed corpus's entity names, queries and description."""

TokenizerLike = Tokenizer | str | os.PathLike
"""A loaded ``tokenizers.Tokenizer`` (no cache) or a folder / tokenizer.json path (cached)."""


def batch_spec(variant: str, warmup_steps: int = 0) -> dict[str, BatchField]:
    """The contract of ``variant``'s batches (with ``mlm_warmup`` when ``warmup_steps``)."""
    return {**BATCH[variant], **(WARMUP if warmup_steps else {})}


def load_data(config: ml_collections.ConfigDict) -> EntityData:
    """Entities, sentences, queries of ``train_file`` or ``train_data``."""
    train_file = str(config.get("train_file", "") or "").strip()
    if train_file:
        data = own_entity_data(train_file)
    elif config.train_data == "amazon":
        from docent_jax.review_data import load_review_data

        data = load_review_data(config)
    else:
        data = squad_entity_data(config.squad_path or None, float(config.heldout_fraction),
                                 int(config.split_seed))
    queries_file = str(config.get("eval_queries_file", "") or "").strip()
    return with_queries_file(data, queries_file) if queries_file else data


def entity_sentence_table(sentences: Sequence[tuple[int, str]], num_entities: int,
                          tokenizer: TokenizerLike, max_length: int) -> TokenTable:
    """``(entity, sentence)`` pairs -> ``input_ids [n, 1, max_length]``, ``text_ids [n, 1]``;
    ValueError: no sentences, a bad entity or sentence (named)."""
    if not sentences:
        raise ValueError("no training sentences")
    entities = np.empty(len(sentences), np.int64)
    texts = []
    for i, (entity, text) in enumerate(sentences):
        if isinstance(entity, bool) or not isinstance(entity, (int, np.integer)) or not (
                0 <= entity < num_entities):
            raise ValueError(f"sentence pair {i}: entity index {entity!r} is not in "
                             f"[0, {num_entities})")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"sentence pair {i} (entity {entity}): empty or not a string")
        entities[i] = entity
        texts.append(text)
    tokens: TokenizedTexts = (tokenize(tokenizer, texts, max_length)
                              if isinstance(tokenizer, Tokenizer)
                              else tokenize_cached(tokenizer, texts, max_length))
    return stack_fields({FIELD: tokens}, {FIELD: entities.astype(np.int32)})


class FullLayout(NamedTuple):
    """Token ids DocEnt-Full's input layout needs (from the tokenizer)."""

    word_vocab_size: int
    sep_id: int
    pad_id: int
    mask_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> FullLayout:
        """Raises ValueError when ``[SEP]``, ``[PAD]`` or ``[MASK]`` is missing."""
        ids = {t: tokenizer.token_to_id(t) for t in ("[SEP]", "[PAD]", "[MASK]")}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"the tokenizer has no {missing}; DocEnt-Full needs a BERT "
                             "word-piece vocabulary")
        return cls(int(tokenizer.get_vocab_size()), ids["[SEP]"], ids["[PAD]"], ids["[MASK]"])


def make_batches(table: TokenTable | shards.Manifest, config: ml_collections.ConfigDict,
                 start_step: int, *, process_index: int = 0, process_count: int = 1,
                 full_layout: FullLayout | None = None,
                 warmup_steps: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """This host's batches from ``start_step`` in the variant's layout (+ ``mlm_warmup``)."""
    variant = config.get("variant", "dual")
    if variant == "full" and full_layout is None:
        raise ValueError("variant 'full' needs full_layout (the tokenizer's ids)")
    from data_pipelines.pipeline import make_batches as batches_of  # loads TensorFlow

    warmup = int(warmup_steps)
    batches = batches_of(
        table, global_batch_size=int(config.batch_size), seed=int(config.seed),
        start_step=start_step, process_index=process_index, process_count=process_count,
        pad_multiple=int(config.pad_multiple))
    for batch in batches:
        batch = dict(batch)
        batch["entity_ids"] = batch.pop("text_ids")[:, 0]
        if variant != "dual":
            for key in TOKENS:
                batch[key] = batch[key][:, 0]
        if variant == "full":
            batch.update(full_inputs_from_tokens(
                batch["input_ids"], batch["attention_mask"].sum(axis=1), batch["entity_ids"],
                word_vocab_size=full_layout.word_vocab_size, sep_id=full_layout.sep_id,
                pad_id=full_layout.pad_id))
        if warmup:
            flag = float(int(batch["step"]) < warmup)
            batch["mlm_warmup"] = np.full(len(batch["entity_ids"]), flag, np.float32)
        yield batch


def sentence_length(config: ml_collections.ConfigDict) -> int:
    """Tokens per training sentence: ``max_length``, less Full's ``<entity> [SEP]``."""
    return int(config.max_length) - (2 if config.get("variant", "dual") == "full" else 0)


def full_inputs_from_tokens(input_ids: np.ndarray, lengths: np.ndarray,
                            entity_ids: np.ndarray, *, word_vocab_size: int, sep_id: int,
                            pad_id: int = 0) -> dict[str, np.ndarray]:
    """``[CLS] <entity> [SEP] sentence [SEP]`` (entity e = token ``word_vocab_size + e``) from
    ``[n, L]`` rows, lengths and entities: ``input_ids``, ``attention_mask``, ``token_type_ids``
    ``[n, L + 2]`` int32, ``entity_ids`` ``[n]``. ValueError: shapes, a negative entity id."""
    ids = np.asarray(input_ids)
    lengths = np.asarray(lengths)
    entity_ids = np.asarray(entity_ids)
    if ids.ndim != 2 or lengths.shape != (ids.shape[0],) or entity_ids.shape != lengths.shape:
        raise ValueError(f"input_ids must be [n, L] with lengths and entity_ids [n]; got "
                         f"{ids.shape}, {lengths.shape}, {entity_ids.shape}")
    if entity_ids.size and entity_ids.min() < 0:
        raise ValueError(f"entity ids must be >= 0, got {entity_ids.min()}")
    n, width = ids.shape
    out = np.full((n, width + 2), pad_id, dtype=np.int32)
    out[:, 0] = ids[:, 0]
    out[:, ENTITY_POSITION] = word_vocab_size + entity_ids
    out[:, 2] = sep_id
    out[:, 3:] = ids[:, 1:]
    positions = np.arange(width + 2)[None, :]
    mask = positions < (lengths[:, None] + 2)
    types = (positions >= 3) & mask
    return {"input_ids": out, "attention_mask": mask.astype(np.int32),
            "token_type_ids": types.astype(np.int32), "entity_ids": entity_ids.astype(np.int32)}


def corpus_source(config: ml_collections.ConfigDict) -> sharded_corpus.CorpusSource:
    """What ``docent-jax preprocess`` writes; FileNotFoundError, DataError, ValueError."""
    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.models.pretrained import resolve_model_dir

    model_dir = resolve_model_dir(config.model)
    tokenizer_json, pad_id = sharded_corpus.tokenizer_files(model_dir)
    tokenizer = load_tokenizer(model_dir)  # a loaded tokenizer: no per-chunk token cache
    data = load_data(config)
    length = sentence_length(config)
    check_entity_ids(data.entity_ids)

    def rows(index: np.ndarray) -> TokenTable:
        return entity_sentence_table([data.sentences[i] for i in index], data.num_entities,
                                     tokenizer, length)

    entities = {"entity_names": list(data.entity_names), "description": data.description,
                "queries": [[text, [int(e) for e in rel]] for text, rel in data.queries]}
    files = {"entity_ids": (ENTITY_IDS_FILE, "".join(f"{e}\n" for e in data.entity_ids
                                                     ).encode("utf-8")),
             "entities": (CORPUS_ENTITIES, json.dumps(entities, ensure_ascii=False
                                                      ).encode("utf-8"))}
    source = {key: config.get(key) for key in (
        "train_data", "train_file", "squad_path", "amazon_paths", "mapping_path",
        "heldout_fraction", "split_seed", "variant", "max_length", "model")}
    return sharded_corpus.CorpusSource(
        fields=(FIELD,), max_length=length, num_rows=len(data.sentences), rows=rows,
        tokenizer_json=tokenizer_json, tokenizer=str(config.model), pad_id=pad_id,
        files=files, source=source, description=f"DocEnt sentences: {data.description}")


def training_data(config: ml_collections.ConfigDict, model_dir: str | os.PathLike
                  ) -> tuple[EntityData, TokenTable | shards.Manifest]:
    """A run's entities and rows (``train_shards`` or in memory); OSError, ValueError."""
    folder = str(config.get("train_shards", "") or "").strip()
    if not folder:
        data = load_data(config)
        return data, entity_sentence_table(data.sentences, data.num_entities, model_dir,
                                           sentence_length(config))
    manifest = sharded_corpus.open_corpus(folder, fields=(FIELD,),
                                          max_length=sentence_length(config),
                                          model_dir=model_dir)
    entity_ids = read_entity_ids(manifest.file_path("entity_ids"))
    path = manifest.file_path("entities")
    try:
        extra = json.loads(storage.as_path(path).read_text(encoding="utf-8"))
        names, queries = extra["entity_names"], [
            (str(text), tuple(int(e) for e in rel)) for text, rel in extra["queries"]]
        description = str(extra["description"])
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(path, None, None, f"not a preprocess entities file ({err})") from None
    if len(names) != len(entity_ids):
        raise DataError(path, None, "entity_names", f"{len(names)} names for "
                        f"{len(entity_ids)} entity ids")
    return EntityData(entity_ids, names, [], queries, f"{description}; streamed from "
                      f"{manifest.num_shards} shards of {folder}"), manifest
