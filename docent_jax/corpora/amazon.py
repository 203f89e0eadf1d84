"""Amazon review readers (plain or gzip; ``docs/data.md``) and DocEnt's review filters."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO

from data_pipelines.errors import DataError
from data_pipelines.text import count_words, remove_entity_name, split_sentences
from docent_jax.corpora import PathLike, decode_utf8
from embedding_core.storage import files, storage

MIN_WORDS = 5  # DocEnt: reviews under 5 words are dropped (sec. 4.4)
MIN_REVIEWS = 5  # DocEnt: movies with under 5 reviews are dropped (sec. 4.4)
_GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass(frozen=True)
class AmazonReview:
    """One review (``overall`` 1.0-5.0, ``unixReviewTime`` s; absent: None); ``line`` 1-based."""

    asin: str
    text: str
    reviewer_id: str | None
    summary: str | None
    overall: float | None
    unix_review_time: int | None
    line: int


def open_maybe_gzip(path: PathLike) -> IO[bytes]:
    """Opens a file for binary reading, through gzip when it starts with its magic bytes."""
    path = storage.as_path(path)
    with path.open("rb") as probe:
        magic = probe.read(2)
    raw = path.open("rb")
    if magic != _GZIP_MAGIC:
        return raw
    unzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    unzipped.myfileobj = raw  # closed with the GzipFile, as when gzip opens a path itself
    return unzipped


def _lines(raw: IO[bytes], path: PathLike) -> Iterator[tuple[int, bytes]]:
    """``(1-based line, bytes)``; damaged gzip: a DataError at that line."""
    line_no = 0
    try:
        for line_no, raw_line in enumerate(raw, start=1):
            yield line_no, raw_line
    except (EOFError, OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(path, line_no + 1, None,
                        f"corrupt or truncated gzip data ({err}); re-download or re-compress "
                        "the file") from None


def _optional(record: dict, key: str, kinds: tuple[type, ...], path: PathLike, line: int):
    value = record.get(key)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
        raise DataError(path, line, key, f"expected {kinds[0].__name__}, got {value!r}")
    return value


def iter_amazon_reviews(path: PathLike, *, skip_invalid: bool = False,
                        counts: Counter[str] | None = None) -> Iterator[AmazonReview]:
    """Streams one file's reviews (blank lines ignored); ``skip_invalid`` skips (and ``counts``)
    ones without ``reviewText``. DataError (file, line, field): invalid UTF-8 or JSON, a bad
    ``asin`` or field, corrupt gzip; FileNotFoundError."""
    counts = counts if counts is not None else Counter()
    with open_maybe_gzip(path) as raw:
        for line_no, raw_line in _lines(raw, path):
            text = decode_utf8(path, raw_line, first_line=line_no)
            if not text.strip():
                continue
            counts["lines"] += 1
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                hint = (" (this looks like a Python dict literal, the format of the 2014 metadata "
                        "files, not of review files)" if text.lstrip().startswith("{'") else "")
                raise DataError(path, line_no, None, f"invalid JSON: {err.msg}{hint}") from None
            if not isinstance(record, dict):
                raise DataError(path, line_no, None, "line is not a JSON object")
            asin = record.get("asin")
            if not isinstance(asin, str) or not asin.strip():
                raise DataError(path, line_no, "asin", "missing or empty product id")
            review_text = _optional(record, "reviewText", (str,), path, line_no)
            if review_text is None:
                if not skip_invalid:
                    raise DataError(path, line_no, "reviewText", "missing review text")
                counts["missing_review_text"] += 1
                continue
            overall = _optional(record, "overall", (float, int), path, line_no)
            yield AmazonReview(
                asin=asin, text=review_text,
                reviewer_id=_optional(record, "reviewerID", (str,), path, line_no),
                summary=_optional(record, "summary", (str,), path, line_no),
                overall=None if overall is None else float(overall),
                unix_review_time=_optional(record, "unixReviewTime", (int,), path, line_no),
                line=line_no)


class EntityVocab:
    """Entity keys with stable ids (sorted distinct keys), saved one per line; ValueError: an
    empty key or a line break."""

    def __init__(self, keys: Iterable[str]):
        self._keys: tuple[str, ...] = tuple(sorted(set(keys)))
        for key in self._keys:
            if not key or "\n" in key or "\r" in key:
                raise ValueError(f"entity key {key!r} is empty or holds a line break")
        self._ids = {key: i for i, key in enumerate(self._keys)}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EntityVocab) and self._keys == other._keys

    def __hash__(self) -> int:
        return hash(self._keys)

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    def id_of(self, key: str) -> int:
        """The id of ``key``. Raises KeyError (naming the key) for an unknown key."""
        try:
            return self._ids[key]
        except KeyError:
            raise KeyError(f"entity {key!r} is not in the vocabulary ({len(self)} entities)"
                           ) from None

    def key_of(self, entity_id: int) -> str:
        """The key of ``entity_id``. Raises IndexError for an id outside ``[0, len)``."""
        if not 0 <= entity_id < len(self._keys):
            raise IndexError(f"entity id {entity_id} outside [0, {len(self._keys)})")
        return self._keys[entity_id]

    def save(self, path: PathLike) -> None:
        files.write_lines(path, self._keys)

    @classmethod
    def load(cls, path: PathLike) -> EntityVocab:
        """Reads :meth:`save`'s file; DataError (bad line, unsorted keys), FileNotFoundError."""
        lines = decode_utf8(path, storage.as_path(path).read_bytes(), "key").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, key in enumerate(lines):
            if not key or "\r" in key:
                raise DataError(path, i + 1, "key", "empty key or carriage return in the line")
            if i and key <= lines[i - 1]:
                raise DataError(path, i + 1, "key", f"keys must be sorted and distinct; {key!r} "
                                f"follows {lines[i - 1]!r}")
        return cls(lines)


@dataclasses.dataclass
class ReviewCorpusStats:
    """Counts of the DocEnt review filters, in the order they apply."""

    reviews_read: int = 0  # non-blank lines read
    missing_review_text: int = 0  # skipped without reviewText
    duplicates_dropped: int = 0  # repeats of (reviewer, entity, text) after aggregation
    unmapped_dropped: int = 0  # ASIN without an entity in entity_of
    short_reviews_dropped: int = 0  # under min_words words
    entities_seen: int = 0  # distinct entities of the remaining reviews
    entities_kept: int = 0  # with >= min_reviews remaining reviews
    reviews_kept: int = 0  # remaining reviews of kept entities
    sentences: int = 0  # yielded (after name removal)
    sentences_emptied: int = 0  # left empty by name removal (not yielded)


def _filtered_reviews(paths: PathLike | Sequence[PathLike], stats: ReviewCorpusStats, *,
                      min_words: int, entity_of: Mapping[str, str] | None, deduplicate: bool,
                      skip_invalid: bool) -> Iterator[tuple[str, AmazonReview]]:
    """Yields (entity key, review) for reviews passing the per-review filters."""
    seen: set[bytes] = set()
    for path in [paths] if isinstance(paths, (str, os.PathLike)) else list(paths):
        counts: Counter[str] = Counter()
        for review in iter_amazon_reviews(path, skip_invalid=skip_invalid, counts=counts):
            if entity_of is None:
                entity = review.asin
            elif review.asin in entity_of:
                entity = entity_of[review.asin]
            else:
                stats.unmapped_dropped += 1
                continue
            if deduplicate:
                # Editions (ASINs) of one movie often list the same review; after aggregation
                # it is a duplicate. A 16-byte digest keeps the set small.
                key = "\x1f".join((review.reviewer_id or "", entity, review.text)).encode()
                digest = hashlib.blake2b(key, digest_size=16).digest()
                if digest in seen:
                    stats.duplicates_dropped += 1
                    continue
                seen.add(digest)
            if count_words(review.text) < min_words:
                stats.short_reviews_dropped += 1
                continue
            yield entity, review
        stats.reviews_read += counts["lines"]
        stats.missing_review_text += counts["missing_review_text"]


def select_entities(paths: PathLike | Sequence[PathLike], *, min_words: int = MIN_WORDS,
                    min_reviews: int = MIN_REVIEWS, entity_of: Mapping[str, str] | None = None,
                    deduplicate: bool = True,
                    skip_invalid: bool = False) -> tuple[EntityVocab, ReviewCorpusStats]:
    """First pass: ``(vocab, stats)`` of the entities keeping ``min_reviews`` reviews after the
    filters (``entity_of``, ``deduplicate``, ``min_words``); DataError."""
    stats = ReviewCorpusStats()
    per_entity: Counter[str] = Counter(
        entity for entity, _ in _filtered_reviews(
            paths, stats, min_words=min_words, entity_of=entity_of, deduplicate=deduplicate,
            skip_invalid=skip_invalid))
    vocab = EntityVocab(e for e, n in per_entity.items() if n >= min_reviews)
    stats.entities_seen = len(per_entity)
    stats.entities_kept = len(vocab)
    stats.reviews_kept = sum(per_entity[e] for e in vocab.keys)
    return vocab, stats


def iter_entity_sentences(paths: PathLike | Sequence[PathLike], vocab: EntityVocab, *,
                          min_words: int = MIN_WORDS, entity_of: Mapping[str, str] | None = None,
                          names: Mapping[str, str] | None = None, deduplicate: bool = True,
                          skip_invalid: bool = False,
                          sentence_splitter: Callable[[str], list[str]] = split_sentences,
                          stats: ReviewCorpusStats | None = None) -> Iterator[tuple[int, str]]:
    """Second pass: ``(entity id, sentence)`` in file order, names removed; DataError."""
    stats = stats if stats is not None else ReviewCorpusStats()
    scratch = ReviewCorpusStats()  # pass-1 counters are not counted twice
    for entity, review in _filtered_reviews(
            paths, scratch, min_words=min_words, entity_of=entity_of, deduplicate=deduplicate,
            skip_invalid=skip_invalid):
        if entity not in vocab:
            continue
        entity_id = vocab.id_of(entity)
        name = names.get(entity) if names is not None else None
        for sentence in sentence_splitter(review.text):
            if name:
                sentence = remove_entity_name(sentence, name)
            if not sentence:
                stats.sentences_emptied += 1
                continue
            stats.sentences += 1
            yield entity_id, sentence


@dataclasses.dataclass(frozen=True)
class ReviewCorpus:
    """Kept entities, ``(entity_id, sentence)`` pairs, filter counts."""

    vocab: EntityVocab
    sentences: list[tuple[int, str]]
    stats: ReviewCorpusStats


def build_review_corpus(paths: PathLike | Sequence[PathLike], *, min_reviews: int = MIN_REVIEWS,
                        names: Mapping[str, str] | None = None,
                        sentence_splitter: Callable[[str], list[str]] = split_sentences,
                        **filters) -> ReviewCorpus:
    """Both passes in memory; ``filters`` as :func:`select_entities`; DataError."""
    vocab, stats = select_entities(paths, min_reviews=min_reviews, **filters)
    sentences = list(iter_entity_sentences(paths, vocab, names=names, stats=stats,
                                           sentence_splitter=sentence_splitter, **filters))
    return ReviewCorpus(vocab=vocab, sentences=sentences, stats=stats)
