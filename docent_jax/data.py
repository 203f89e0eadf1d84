"""DocEnt's data: (entity, sentence) tables, the held-out query protocol, batches, masking.

Training examples are single sentences; the :class:`~data_pipelines.table.TokenTable` has one
field ``"sentence"`` whose ``text_ids`` entry is the sentence's *entity* index (the generic
pipeline's name for it); :func:`make_batches` hands it to the model as ``entity_ids``, so
the in-batch loss masks other sentences of the same entity and the full-vocabulary softmax
reads its targets from it.

The shipped zero-shot ranking task (our protocol, ``docs/docent.md``; the paper's Reddit
queries are not shippable) uses the SQuAD v1.1 dev set: entity = Wikipedia article (48),
documents = the sentences of its paragraphs with the title removed, queries = the
questions. Entities must be seen in training, so the split is by *paragraph* inside each
article (:func:`paragraph_split`): the sentences of about 80% of each article's paragraphs
train the model, the questions of the other 20% are the held-out queries. Neither the
held-out paragraphs' sentences nor any question text is ever seen in training; baselines
build their entity representations from the same training sentences.

DocEnt-Full inputs: :func:`full_inputs_from_tokens` builds ``[CLS] <entity> [SEP] sentence
[SEP]``; ``docent_jax.masking`` corrupts a batch inside the jitted loss.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import ml_collections
import numpy as np
from tokenizers import Tokenizer

from data_pipelines import entity_documents, sharded_corpus, shards, squad
from data_pipelines.errors import DataError
from data_pipelines.table import TokenTable, stack_fields
from data_pipelines.text import split_sentences
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached
from docent_jax.corpus import EntityData
from docent_jax.masking import ENTITY_POSITION
from embedding_core import storage
from embedding_core.files import write_lines

TokenizerLike = Tokenizer | str | os.PathLike
"""A loaded ``tokenizers.Tokenizer`` (no cache) or a folder / tokenizer.json path (cached)."""

FIELD = "sentence"
ENTITY_IDS_FILE = "entity_ids.txt"
"""The run file naming the table's rows (line i = entity of row i)."""


def paragraph_split(
    articles: Sequence[squad.SquadArticle], heldout_fraction: float, seed: int
) -> tuple[list[squad.SquadArticle], list[squad.SquadArticle]]:
    """Splits every article's paragraphs into training and held-out ones.

    In article ``a`` (0-based position) with ``n`` paragraphs, ``round(heldout_fraction * n)``
    paragraphs, clipped to ``[1, n - 1]`` (so each article keeps training text and, with
    ``n >= 2``, held-out queries), chosen by ``np.random.default_rng([seed, a]).permutation``,
    are held out. Articles with one paragraph keep it for training.

    Args:
      articles: e.g. from :func:`data_pipelines.squad.read_squad`.
      heldout_fraction: share of each article's paragraphs held out, in (0, 1).
      seed: the same seed gives the same split.

    Returns:
      ``(train, heldout)``: the same articles in the same order, each with its training or
      its held-out paragraphs (file order kept); an article may have no held-out paragraph.

    Raises:
      ValueError: ``heldout_fraction`` outside (0, 1).
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    train, heldout = [], []
    for index, article in enumerate(articles):
        n = len(article.paragraphs)
        k = min(max(int(round(heldout_fraction * n)), 1), n - 1) if n >= 2 else 0
        held = set(np.random.default_rng([seed, index]).permutation(n)[:k].tolist())
        train.append(squad.SquadArticle(
            article.title, [p for i, p in enumerate(article.paragraphs) if i not in held]))
        heldout.append(squad.SquadArticle(
            article.title, [p for i, p in enumerate(article.paragraphs) if i in held]))
    return train, heldout


@functools.lru_cache(maxsize=4)
def squad_entity_data(
    path: str | None = None,
    heldout_fraction: float = 0.2,
    seed: int = 0,
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
) -> EntityData:
    """The Wikipedia entity ranking task built from SQuAD (module docstring).

    Args:
      path: a SQuAD v1.1 file (JSON or zip); default the shipped dev set.
      heldout_fraction, seed: see :func:`paragraph_split`.
      sentence_splitter: text -> sentences (default pySBD).

    Returns:
      :class:`EntityData`: sentences of the training paragraphs (title removed), queries =
      the questions of the held-out paragraphs, each with its article as the one relevant
      entity. Cached per arguments within the process.

    Raises:
      DataError, FileNotFoundError: see :func:`data_pipelines.squad.read_squad`.
    """
    articles, _ = squad.read_squad(path)
    train, heldout = paragraph_split(articles, heldout_fraction, seed)
    corpus = squad.wikipedia_entity_corpus(train, sentence_splitter)
    # Only the questions are needed from the held-out side: skip its sentence splitting.
    held = squad.wikipedia_entity_corpus(heldout, lambda text: [])
    queries = [(text, (entity,)) for text, entity in held.queries]
    n_train_p = sum(len(a.paragraphs) for a in train)
    n_held_p = sum(len(a.paragraphs) for a in heldout)
    description = (
        f"SQuAD v1.1 {'dev (shipped)' if path is None else path}: {len(corpus.entity_ids)} "
        f"article entities; training sentences from {n_train_p} paragraphs, held-out "
        f"queries = the {len(queries)} questions of {n_held_p} other paragraphs "
        f"(heldout_fraction={heldout_fraction}, seed={seed})")
    return EntityData(corpus.entity_ids, corpus.entity_names, corpus.sentences, queries,
                      description)


def _tokenize(tokenizer: TokenizerLike, texts: Sequence[str], max_length: int
              ) -> TokenizedTexts:
    if isinstance(tokenizer, Tokenizer):
        return tokenize(tokenizer, texts, max_length)
    return tokenize_cached(tokenizer, texts, max_length)


def entity_sentence_table(
    sentences: Sequence[tuple[int, str]],
    num_entities: int,
    tokenizer: TokenizerLike,
    max_length: int,
) -> TokenTable:
    """Training table: one row per (entity, sentence) pair, field ``"sentence"``.

    Args:
      sentences: ``(entity_index, sentence)`` pairs.
      num_entities: entity indices must lie in ``[0, num_entities)``.
      tokenizer: a loaded tokenizer, or a tokenizer folder / file (then cached on disk).
      max_length: tokens per sentence including [CLS]/[SEP]; longer sentences are cut.

    Returns:
      TokenTable with ``input_ids [n, 1, max_length]`` and ``text_ids [n, 1]`` = the entity
      index of each sentence.

    Raises:
      ValueError: no sentences, an entity index out of range or a non-string / empty
        sentence (the pair's 0-based position is named).
    """
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
    tokens = _tokenize(tokenizer, texts, max_length)
    return stack_fields({FIELD: tokens}, {FIELD: entities.astype(np.int32)})


def own_entity_data(path: str) -> EntityData:
    """The user's entity documents (``config.train_file``) as :class:`EntityData`.

    ``data_pipelines.entity_documents``: JSON Lines ``{"entity", "text"}``, each text split
    into sentences (pySBD); entity ids sorted, names = ids; no queries (see
    :func:`with_queries_file`).

    Raises:
      FileNotFoundError: no such file.
      DataError: a bad line (file, line and field named).
    """
    docs = entity_documents.read_entity_documents(path)
    entity_ids, sentences = entity_documents.entity_sentences(docs)
    description = (f"{path}: {len(docs)} documents of {len(entity_ids)} entities (ids "
                   f"sorted), {len(sentences)} sentences")
    return EntityData(entity_ids, list(entity_ids), sentences, [], description)


def with_queries_file(data: EntityData, path: str) -> EntityData:
    """``data`` with its queries replaced by those of a queries file
    (``config.eval_queries_file``: JSON Lines ``{"query", "entities": [ids]}``).

    Raises:
      FileNotFoundError: no such file.
      DataError: a bad line, or an entity id not among ``data.entity_ids`` (line named).
    """
    index = {e: i for i, e in enumerate(data.entity_ids)}
    queries = entity_documents.read_entity_queries(path, index)
    return dataclasses.replace(
        data, queries=queries,
        description=f"{data.description}; ranking queries: the {len(queries)} of {path}")


def load_data(config: ml_collections.ConfigDict) -> EntityData:
    """The entities, training sentences and held-out queries a config names:
    ``config.train_file`` (:func:`own_entity_data`) when set, else ``train_data``
    (``"amazon"``: ``docent_jax.review_data.load_review_data``; ``"squad"``:
    :func:`squad_entity_data`); ``config.eval_queries_file`` replaces the queries."""
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


def make_batches(table: TokenTable | shards.Manifest, config: ml_collections.ConfigDict,
                 start_step: int, *,
                 process_index: int = 0, process_count: int = 1,
                 full_layout: FullLayout | None = None,
                 warmup_steps: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """This host's training batches from ``start_step`` on (resumable, in the seed's order).

    ``data_pipelines.pipeline.make_batches`` (or, for a sharded corpus from
    :func:`training_data`, ``data_pipelines.sharded_corpus.make_batches``: this host's
    shards streamed) with DocEnt's names and each variant's layout:

    * ``variant="dual"``: ``input_ids``, ``attention_mask``, ``token_type_ids``
      ``[B/P, 1, L]`` int32 (one field, the sentence);
    * ``"hybrid"``: the same arrays as ``[B/P, L]`` (the sentence alone);
    * ``"full"``: ``[B/P, L + 2]`` in the :func:`full_inputs_from_tokens` layout
      ``[CLS] <entity> [SEP] sentence [SEP]`` (``full_layout`` gives the ids);

    plus ``entity_ids`` ``[B/P]`` int32 (the table's ``text_ids`` column), ``step``, and with
    ``warmup_steps > 0`` (``docent_jax.optimizer.head_warmup_steps``) ``mlm_warmup``
    ``[B/P]`` float32 (1.0 during the first ``warmup_steps`` steps).
    """
    variant = config.get("variant", "dual")
    if variant == "full" and full_layout is None:
        raise ValueError("variant 'full' needs full_layout (the tokenizer's ids)")
    warmup = int(warmup_steps)
    batches = sharded_corpus.batches_of(
        table, global_batch_size=int(config.batch_size), seed=int(config.seed),
        start_step=start_step, process_index=process_index, process_count=process_count,
        pad_multiple=int(config.pad_multiple))
    for batch in batches:
        batch = dict(batch)
        batch["entity_ids"] = batch.pop("text_ids")[:, 0]
        if variant != "dual":
            for key in ("input_ids", "attention_mask", "token_type_ids"):
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


class FullLayout(NamedTuple):
    """Token ids DocEnt-Full's input layout needs (from the tokenizer)."""

    word_vocab_size: int
    sep_id: int
    pad_id: int
    mask_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> FullLayout:
        """Reads ``[SEP]``, ``[PAD]``, ``[MASK]`` and the vocabulary size.

        Raises:
          ValueError: a BERT special token is missing.
        """
        ids = {t: tokenizer.token_to_id(t) for t in ("[SEP]", "[PAD]", "[MASK]")}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"the tokenizer has no {missing}; DocEnt-Full needs a BERT "
                             "word-piece vocabulary")
        return cls(int(tokenizer.get_vocab_size()), ids["[SEP]"], ids["[PAD]"], ids["[MASK]"])


def sentence_length(config: ml_collections.ConfigDict) -> int:
    """Tokens per training sentence: ``max_length``, less the 2 entity-segment tokens
    ``<entity> [SEP]`` for Full (so Full's whole input fits ``max_length``)."""
    return int(config.max_length) - (2 if config.get("variant", "dual") == "full" else 0)


def write_entity_ids(path: str | os.PathLike, entity_ids: Sequence[str]) -> None:
    """Writes one id per line (UTF-8, line i = row i), atomically and readable by others
    (``embedding_core.files.write_lines``).

    Raises:
      ValueError: an empty id, or one holding a line break.
    """
    for i, key in enumerate(entity_ids):
        if not key or "\n" in key or "\r" in key:
            raise ValueError(f"entity {i}: id {key!r} is empty or holds a line break")
    write_lines(path, entity_ids)


def keep_entity_ids(path: str | os.PathLike, entity_ids: Sequence[str]) -> None:
    """A run's ``entity_ids.txt``: written on the first start; on a resume the data's
    entities must be those the checkpoint's rows were trained for.

    Raises:
      ValueError: the file exists and names other entities (the data changed since the
        run started: every row would carry another entity's id).
    """
    path = storage.as_path(path)
    if path.is_file():
        saved = read_entity_ids(path)
        if saved != list(entity_ids):
            changed = sorted(set(saved) ^ set(entity_ids))
            raise ValueError(
                f"{path}: the data's entities changed since this run started ({len(saved)} "
                f"saved, {len(entity_ids)} now; e.g. {changed[:3]}); resuming would give the "
                "trained rows other entities' ids: restore the data files or use a new "
                "--workdir")
        return
    write_entity_ids(path, entity_ids)


def read_entity_ids(path: str | os.PathLike) -> list[str]:
    """Reads a file written by :func:`write_entity_ids`.

    Raises:
      FileNotFoundError: no such file.
      DataError: invalid UTF-8, an empty line or a repeated id (with its 1-based line).
    """
    path = storage.as_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"entity id file {path} does not exist")
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    ids: list[str] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(lines, start=1):
        try:
            key = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as err:
            raise DataError(path, lineno, "entity_id", f"invalid UTF-8 ({err.reason})") from None
        if not key:
            raise DataError(path, lineno, "entity_id", "empty id")
        if key in seen:
            raise DataError(path, lineno, "entity_id", f"id {key!r} repeats line {seen[key]}")
        seen[key] = lineno
        ids.append(key)
    if not ids:
        raise DataError(path, None, "entity_id", "no entity ids in file")
    return ids


def full_inputs_from_tokens(
    input_ids: np.ndarray,
    lengths: np.ndarray,
    entity_ids: np.ndarray,
    *,
    word_vocab_size: int,
    sep_id: int,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """DocEnt-Full inputs ``[CLS] <entity> [SEP] sentence [SEP]`` from tokenised sentences.

    Args:
      input_ids: ``[n, L]`` int32 rows ``[CLS] sentence [SEP] pad...`` (e.g.
        ``data_pipelines.tokenization.tokenize(tokenizer, sentences, L)``).
      lengths: ``[n]`` int32 real tokens per row.
      entity_ids: ``[n]`` int entity index of each sentence, in ``[0, num_entities)``.
      word_vocab_size: entity ``e`` gets token id ``word_vocab_size + e``.
      sep_id, pad_id: ids of ``[SEP]`` and padding.

    Returns:
      ``input_ids``, ``attention_mask``, ``token_type_ids``: ``[n, L + 2]`` int32 (token type
      0 for ``[CLS] <entity> [SEP]``, 1 for the sentence and its final ``[SEP]``, 0 on
      padding); ``entity_ids``: ``[n]`` int32.

    Raises:
      ValueError: shapes disagree or an entity id is negative.
    """
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


CORPUS_ENTITIES = "entities.json"
"""A preprocessed corpus's entity names, ranking queries and description (beside its
``entity_ids.txt``), so that training on it needs no source data."""


def corpus_source(config: ml_collections.ConfigDict) -> sharded_corpus.CorpusSource:
    """What ``docent-jax preprocess`` writes: one row per training sentence of
    :func:`load_data` (field ``"sentence"``, ``text_ids`` = entity index), tokenised a chunk
    at a time to :func:`sentence_length`, plus ``entity_ids.txt`` and ``entities.json``.

    Raises:
      FileNotFoundError: no model or data file. DataError: malformed data.
      ValueError: see :func:`entity_sentence_table`, :func:`write_entity_ids`.
    """
    import json

    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.pretrained import resolve_model_dir

    model_dir = resolve_model_dir(config.model)
    tokenizer_json, pad_id = sharded_corpus.tokenizer_files(model_dir)
    tokenizer = load_tokenizer(model_dir)  # a loaded tokenizer: no per-chunk token cache
    data = load_data(config)
    length = sentence_length(config)
    for i, key in enumerate(data.entity_ids):
        if not key or "\n" in key or "\r" in key:
            raise ValueError(f"entity {i}: id {key!r} is empty or holds a line break")

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
    """The entities and training rows of a run.

    ``config.train_shards`` set: the preprocessed corpus (its manifest must match the
    field, :func:`sentence_length` and the model's tokenizer); the entities and queries
    come from its ``entity_ids.txt`` and ``entities.json`` and no sentence is loaded: the
    hosts stream the rows (:func:`make_batches`). Otherwise :func:`load_data` and
    :func:`entity_sentence_table` in memory.

    Raises:
      FileNotFoundError: no corpus, data or model file.
      ValueError, DataError: a corpus made for other settings or a malformed file (named).
    """
    import json

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
