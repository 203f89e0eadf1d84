"""DocEnt's Amazon training data (``docs/docent_tags.md``, "Training corpus")."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import ml_collections

from docent_jax.corpora import amazon, reddit, reviews2movielens
from docent_jax.corpus import EntityData
from embedding_core.storage import storage

# (path, size, mtime): a file as the cache sees it; mtime in ns locally, in s on gs://.
FileKey = tuple[str, int, int]


def _field(config: ml_collections.ConfigDict, name: str) -> str:
    return str(config.get(name, "") or "").strip()


def _file_key(path: str, field: str) -> FileKey:
    p = storage.as_path(path)
    if not p.is_file():
        what = "does not exist" if not p.exists() else "is not a file"
        raise FileNotFoundError(f"config.{field}: {p} {what}")
    if storage.is_remote(p):
        info = p.stat()
        return os.fspath(p), int(info.length), int(info.mtime)
    stat = os.stat(p)
    return str(p), stat.st_size, stat.st_mtime_ns


def review_paths(config: ml_collections.ConfigDict) -> list[str]:
    """``config.amazon_paths``'s files (comma-separated); ValueError when empty."""
    paths = [p.strip() for p in _field(config, "amazon_paths").split(",") if p.strip()]
    if not paths:
        raise ValueError(
            "config.amazon_paths is empty: train_data=amazon needs the Amazon Movies & TV "
            "review files; pass --config.amazon_paths=FILE[,FILE...] (JSON lines, 2014 or "
            "2018 format, plain or .gz; see docs/docent_tags.md)")
    return paths


def mapping_path(config: ml_collections.ConfigDict) -> str:
    """``config.mapping_path``; ValueError, saying what to pass, when it is empty."""
    path = _field(config, "mapping_path")
    if not path:
        raise ValueError(
            "config.mapping_path is empty: train_data=amazon and the tag evaluation need the "
            "Reviews2Movielens mapping; pass --config.mapping_path=Reviews2Movielens.csv "
            "(columns asin,canon_asin,imdb_id,movielens_id,name,imdb_url)")
    return path


def load_review_data(config: ml_collections.ConfigDict) -> EntityData:
    """``EntityData`` of the config's Amazon files (cached on paths, sizes, mtimes); ValueError
    (empty paths, thresholds, no movie, an ASIN on two ids), FileNotFoundError, DataError."""
    paths = tuple(_file_key(p, "amazon_paths") for p in review_paths(config))
    mapping = _file_key(mapping_path(config), "mapping_path")
    reddit_file = _field(config, "eval_reddit_path")
    reddit_key = _file_key(reddit_file, "eval_reddit_path") if reddit_file else None
    min_words, min_reviews = int(config.min_review_words), int(config.min_reviews)
    if min_words < 1 or min_reviews < 1:
        raise ValueError(f"config.min_review_words={min_words} and config.min_reviews="
                         f"{min_reviews} must be >= 1 (paper: 5 and 5)")
    return _load(paths, mapping, reddit_key, min_words, min_reviews)


@functools.lru_cache(maxsize=2)
def _load(paths: tuple[FileKey, ...], mapping: FileKey, reddit_key: FileKey | None,
          min_words: int, min_reviews: int) -> EntityData:
    rows, _ = reviews2movielens.read_reviews2movielens(mapping[0])
    entity_of = reviews2movielens.canonical_asins(rows)
    names = reviews2movielens.canonical_names(rows)
    # A canonical ASIN mapped to two MovieLens ids is a broken mapping: refuse it at training
    # time rather than at the tag evaluation after hours of training.
    reviews2movielens.canonical_movielens_ids(rows)
    files = [p for p, _, _ in paths]
    corpus = amazon.build_review_corpus(
        files, min_words=min_words, min_reviews=min_reviews, entity_of=entity_of,
        names=names, skip_invalid=True)
    stats, vocab = corpus.stats, corpus.vocab
    where = ", ".join(files)
    if not len(vocab):
        raise ValueError(
            f"no movie of {where} keeps {min_reviews} reviews of {min_words}+ words after the "
            f"filters ({stats.reviews_read} reviews read, {stats.unmapped_dropped} not in "
            f"{mapping[0]}, {stats.short_reviews_dropped} short, {stats.duplicates_dropped} "
            f"duplicates); check config.amazon_paths and config.mapping_path")
    if not corpus.sentences:
        raise ValueError(f"no sentence left in {where} after name removal")
    entity_ids = list(vocab.keys)
    queries, query_note = _reddit_queries(reddit_key, vocab, entity_of)
    description = (
        f"Amazon reviews {where} joined to {mapping[0]} ({len(rows)} ASINs): "
        f"{stats.reviews_read} reviews read, {stats.missing_review_text} without text, "
        f"{stats.unmapped_dropped} of unmapped ASINs, {stats.duplicates_dropped} duplicates, "
        f"{stats.short_reviews_dropped} under {min_words} words dropped; "
        f"{stats.entities_kept} of {stats.entities_seen} movies keep >= {min_reviews} reviews "
        f"({stats.reviews_kept} reviews, {stats.sentences} sentences, "
        f"{stats.sentences_emptied} emptied by name removal); {query_note}")
    return EntityData(entity_ids, [names[e] for e in entity_ids], corpus.sentences, queries,
                      description)


def _reddit_queries(reddit_key: FileKey | None, vocab: amazon.EntityVocab,
                    entity_of: dict[str, str]
                    ) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    if reddit_key is None:
        return [], "no queries (config.eval_reddit_path not set)"
    # A recommendation may name an edition (mapped to its canonical ASIN) or the canonical
    # ASIN itself.
    lookup = {**{c: c for c in entity_of.values()}, **entity_of}
    found, stats = reddit.read_reddit_suggestions(reddit_key[0], vocab, entity_of=lookup,
                                                  skip_invalid=True)
    # Two editions of one movie in one answer are one relevant entity.
    queries = [(q.query_full, tuple(dict.fromkeys(q.entity_ids))) for q in found]
    note = (f"{len(queries)} Reddit queries from {reddit_key[0]} ({stats.records} records; "
            f"{stats.queries_without_results} skipped without a recommended movie among the "
            f"entities, {stats.unknown_results} recommendations of other movies ignored)")
    return queries, note


def entity_movielens_ids(config: ml_collections.ConfigDict,
                         entity_ids: Sequence[str]) -> list[int | None]:
    """Each entity's MovieLens id (None: unmapped) from the run's ``mapping_path``; ValueError:
    not ``train_data="amazon"``, no mapping, an ASIN on two ids; FileNotFoundError; DataError."""
    if config.get("train_data") != "amazon":
        raise ValueError(
            f"tag prediction needs a model trained on movies (config.train_data='amazon' with "
            f"config.mapping_path); this run was trained on "
            f"{config.get('train_file') or config.get('train_data')!r}")
    path, _, _ = _file_key(mapping_path(config), "mapping_path")
    rows, _ = reviews2movielens.read_reviews2movielens(path)
    ids = reviews2movielens.canonical_movielens_ids(rows)
    return [ids.get(e) for e in entity_ids]


def clear_cache() -> None:
    """Forgets the corpora read in this process (tests; a long-lived notebook)."""
    _load.cache_clear()


__all__ = ["clear_cache", "entity_movielens_ids", "load_review_data", "mapping_path",
           "review_paths"]
