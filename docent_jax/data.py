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

DocEnt-Full and DocEnt-Hybrid inputs: :func:`full_inputs_from_tokens` builds
``[CLS] <entity> [SEP] sentence [SEP]``; :func:`mask_word_pieces` and
:func:`mask_entity_tokens` corrupt a batch inside the jitted loss (``docent_jax.loss``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tokenizers import Tokenizer

from data_pipelines import squad
from data_pipelines.errors import DataError
from data_pipelines.table import TokenTable, stack_fields
from data_pipelines.text import split_sentences
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached
from embedding_core.files import write_lines

TokenizerLike = Tokenizer | str | os.PathLike
"""A loaded ``tokenizers.Tokenizer`` (no cache) or a folder / tokenizer.json path (cached)."""

FIELD = "sentence"
ENTITY_IDS_FILE = "entity_ids.txt"
"""The run file naming the table's rows (line i = entity of row i)."""
ENTITY_POSITION = 1
"""Index of the entity token in a DocEnt-Full input ``[CLS] <entity> [SEP] sentence [SEP]``."""


@dataclasses.dataclass(frozen=True)
class EntityData:
    """Entities, their training sentences and held-out entity-seeking queries.

    Attributes:
      entity_ids: ``[num_entities]`` stable keys (row i of the table is entity_ids[i]).
      entity_names: ``[num_entities]`` display names.
      sentences: ``(entity_index, sentence)`` training documents.
      queries: ``(query_text, relevant_entity_indices)`` evaluation queries.
      description: one line saying where the data came from and how it was split.
    """

    entity_ids: list[str]
    entity_names: list[str]
    sentences: list[tuple[int, str]]
    queries: list[tuple[str, tuple[int, ...]]]
    description: str

    @property
    def num_entities(self) -> int:
        return len(self.entity_ids)


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


def load_data(config: ml_collections.ConfigDict) -> EntityData:
    """The entities, training sentences and held-out queries a config names
    (``train_data="amazon"``: ``docent_jax.review_data.load_review_data``)."""
    if config.train_data == "amazon":
        from docent_jax.review_data import load_review_data

        return load_review_data(config)
    return squad_entity_data(config.squad_path or None, float(config.heldout_fraction),
                             int(config.split_seed))


def make_batches(table: TokenTable, config: ml_collections.ConfigDict, start_step: int, *,
                 process_index: int = 0, process_count: int = 1,
                 full_layout: FullLayout | None = None) -> Iterator[dict[str, np.ndarray]]:
    """This host's training batches from ``start_step`` on (resumable, in the seed's order).

    ``data_pipelines.pipeline.make_batches`` with DocEnt's names and each variant's layout:

    * ``variant="dual"``: ``input_ids``, ``attention_mask``, ``token_type_ids``
      ``[B/P, 1, L]`` int32 (one field, the sentence);
    * ``"hybrid"``: the same arrays as ``[B/P, L]`` (the sentence alone);
    * ``"full"``: ``[B/P, L + 2]`` in the :func:`full_inputs_from_tokens` layout
      ``[CLS] <entity> [SEP] sentence [SEP]`` (``full_layout`` gives the ids);

    plus ``entity_ids`` ``[B/P]`` int32 (the table's ``text_ids`` column), ``step``, and for
    Full/Hybrid with ``mlm_head_init="warmup"`` ``mlm_warmup`` ``[B/P]`` float32 (1.0 during
    the first ``mlm_warmup_steps`` steps).
    """
    from data_pipelines import pipeline  # TensorFlow: only once training is certain

    variant = config.get("variant", "dual")
    if variant == "full" and full_layout is None:
        raise ValueError("variant 'full' needs full_layout (the tokenizer's ids)")
    warmup = int(config.mlm_warmup_steps) if (
        variant != "dual" and config.get("mlm_head_init") == "warmup") else 0
    batches = pipeline.make_batches(
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


def read_entity_ids(path: str | os.PathLike) -> list[str]:
    """Reads a file written by :func:`write_entity_ids`.

    Raises:
      FileNotFoundError: no such file.
      DataError: invalid UTF-8, an empty line or a repeated id (with its 1-based line).
    """
    path = Path(path)
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


# ----------------------------------------------------------------------------- masking


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How word pieces and entity tokens are masked.

    Attributes:
      mask_token_id: id of ``[MASK]`` (103 for BERT uncased vocabularies).
      word_vocab_size: word-piece vocabulary size; ids at or above it are entity tokens.
      special_token_ids: ids never masked (``[CLS]``, ``[SEP]``, ``[PAD]``, ``[MASK]``).
      word_mask_rate: expected fraction of a sentence's maskable word pieces that are
        predicted (BERT 0.15).
      entity_mask_rate: probability that an example's entity token is replaced by
        ``[MASK]`` and predicted (DocEnt-Full only; the paper's footnote 5 calls the relative
        masking frequency of entities a hyperparameter; 0.15 treats it like any token).
      max_predictions: most predicted word pieces per sequence (BERT's
        ``max_predictions_per_seq``, 20 for 128 tokens); bounds the ``[batch, P, vocab]``
        logits.
      mask_prob, random_prob: BERT's 80/10/10 rule: of the selected word pieces
        ``mask_prob`` become ``[MASK]``, ``random_prob`` a uniformly random word piece and the
        rest are kept unchanged (still predicted).
    """

    mask_token_id: int
    word_vocab_size: int
    special_token_ids: tuple[int, ...]
    word_mask_rate: float = 0.15
    entity_mask_rate: float = 0.15
    max_predictions: int = 20
    mask_prob: float = 0.8
    random_prob: float = 0.1

    def __post_init__(self) -> None:
        for name in ("word_mask_rate", "entity_mask_rate", "mask_prob", "random_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MaskingConfig.{name} must lie in [0, 1], got "
                                 f"{getattr(self, name)}")
        if self.mask_prob + self.random_prob > 1.0:
            raise ValueError("MaskingConfig.mask_prob + random_prob must be <= 1, got "
                             f"{self.mask_prob} + {self.random_prob}")
        if self.max_predictions < 1:
            raise ValueError(f"MaskingConfig.max_predictions must be >= 1, got "
                             f"{self.max_predictions}")
        if not 0 <= self.mask_token_id < self.word_vocab_size:
            raise ValueError(f"MaskingConfig.mask_token_id {self.mask_token_id} is not a word "
                             f"piece id (vocabulary size {self.word_vocab_size})")

    @classmethod
    def from_tokenizer(cls, tokenizer, **fields: Any) -> MaskingConfig:
        """Reads ``[MASK]``, the special tokens and the vocabulary size from a BERT
        ``tokenizers.Tokenizer``; ``fields`` set the rates and limits.

        Raises:
          ValueError: the tokenizer has no ``[MASK]`` token.
        """
        mask = tokenizer.token_to_id("[MASK]")
        if mask is None:
            raise ValueError("the tokenizer has no [MASK] token; DocEnt's MLM needs a BERT "
                             "word-piece vocabulary")
        specials = tuple(
            i for i in (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))
            if i is not None)
        return cls(mask_token_id=int(mask), word_vocab_size=int(tokenizer.get_vocab_size()),
                   special_token_ids=specials, **fields)


class MaskedTokens(NamedTuple):
    """Word-piece masking of a batch.

    Attributes:
      input_ids: ``[batch, seq_len]`` int32 ids after the 80/10/10 replacement.
      positions: ``[batch, P]`` int32 positions of the predictions (slots with weight 0 point
        at an arbitrary position and are ignored).
      labels: ``[batch, P]`` int32 original ids at ``positions``.
      weights: ``[batch, P]`` float32, 1 for a prediction, 0 for an unused slot.
    """

    input_ids: jax.Array
    positions: jax.Array
    labels: jax.Array
    weights: jax.Array


def maskable_word_pieces(input_ids: jax.Array, attention_mask: jax.Array,
                         masking: MaskingConfig) -> jax.Array:
    """``[batch, seq_len]`` bool: real tokens that are word pieces and not special tokens
    (so never ``[CLS]``, ``[SEP]``, padding or an entity token)."""
    input_ids = jnp.asarray(input_ids)
    ok = (jnp.asarray(attention_mask) != 0) & (input_ids < masking.word_vocab_size)
    for special in masking.special_token_ids:
        ok &= input_ids != special
    return ok


def mask_word_pieces(rng: jax.Array, input_ids: jax.Array, maskable: jax.Array,
                     masking: MaskingConfig) -> MaskedTokens:
    """BERT masked-LM corruption (Devlin et al. 2019, sec. 3.1, appendix A.1).

    Per sequence with ``n`` maskable tokens, ``k = min(floor(n * rate + u), P, n)`` with
    ``u ~ U[0, 1)`` positions are drawn uniformly without replacement (stochastic rounding:
    ``E[k] = n * rate`` exactly unless the ``P = max_predictions`` cap binds; BERT's data
    script uses ``round``); each is replaced by ``[MASK]`` (``mask_prob``), a uniformly
    random word piece (``random_prob``) or kept.

    Args:
      rng: PRNG key.
      input_ids: ``[batch, seq_len]`` int32.
      maskable: ``[batch, seq_len]`` bool, e.g. :func:`maskable_word_pieces`.
      masking: rates and ids.

    Returns:
      :class:`MaskedTokens` with ``P = min(max_predictions, seq_len)`` slots.
    """
    input_ids, maskable = jnp.asarray(input_ids), jnp.asarray(maskable)
    batch, seq_len = input_ids.shape
    slots = min(masking.max_predictions, seq_len)
    k_count, k_pick, k_mode, k_rand = jax.random.split(rng, 4)
    n = jnp.sum(maskable, axis=1).astype(jnp.float32)
    u = jax.random.uniform(k_count, (batch,))
    count = jnp.floor(n * masking.word_mask_rate + u).astype(jnp.int32)
    count = jnp.minimum(count, jnp.minimum(n.astype(jnp.int32), slots))
    # A random order of the maskable positions: the `count` smallest keys are taken.
    keys = jnp.where(maskable, jax.random.uniform(k_pick, (batch, seq_len)), 2.0)
    _, positions = jax.lax.top_k(-keys, slots)
    positions = positions.astype(jnp.int32)
    selected = jnp.arange(slots)[None, :] < count[:, None]
    labels = jnp.take_along_axis(input_ids, positions, axis=1)
    mode = jax.random.uniform(k_mode, (batch, slots))
    random_ids = jax.random.randint(k_rand, (batch, slots), 0, masking.word_vocab_size,
                                    dtype=input_ids.dtype)
    new = jnp.where(mode < masking.mask_prob, masking.mask_token_id,
                    jnp.where(mode < masking.mask_prob + masking.random_prob, random_ids, labels))
    new = jnp.where(selected, new, labels).astype(input_ids.dtype)
    rows = jnp.arange(batch)[:, None]
    # top_k returns distinct positions per row, so the scatter has no conflicting writes.
    corrupted = input_ids.at[rows, positions].set(new)
    return MaskedTokens(corrupted, positions, labels.astype(jnp.int32),
                        selected.astype(jnp.float32))


def mask_entity_tokens(rng: jax.Array, input_ids: jax.Array,
                       masking: MaskingConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Replaces the entity token (position :data:`ENTITY_POSITION`) by ``[MASK]`` with
    probability ``entity_mask_rate`` per example (always ``[MASK]``: no 80/10/10 rule for
    entities, our reading of the paper's "masking and predicting this token").

    Args:
      rng: PRNG key.
      input_ids: ``[batch, seq_len]`` int32 DocEnt-Full inputs.

    Returns:
      ``(input_ids, labels, weights)``: corrupted ``[batch, seq_len]`` int32 ids, ``[batch]``
      int32 union-vocabulary ids of the entity tokens, ``[batch]`` float32 1 where the
      entity is masked (rows without an entity token, e.g. padding rows, never are).
    """
    input_ids = jnp.asarray(input_ids)
    labels = input_ids[:, ENTITY_POSITION]
    draw = jax.random.uniform(rng, labels.shape) < masking.entity_mask_rate
    masked = draw & (labels >= masking.word_vocab_size)
    column = jnp.where(masked, masking.mask_token_id, labels).astype(input_ids.dtype)
    return (input_ids.at[:, ENTITY_POSITION].set(column), labels.astype(jnp.int32),
            masked.astype(jnp.float32))


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
