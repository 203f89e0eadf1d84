"""Amazon review readers and the DocEnt review corpus (entities = products, documents = sentences).

Files are JSON lines, one review per line, plain or gzip (detected by the magic bytes
``1f 8b``, not by the name), as published by the McAuley lab:

- 2014 format (He & McAuley, WWW 2016; e.g. ``reviews_Movies_and_TV_5.json.gz``): keys
  ``reviewerID, asin, reviewerName, helpful, reviewText, overall, summary, unixReviewTime,
  reviewTime``.
- 2018 format (Ni, Li & McAuley, EMNLP 2019; e.g. ``Movies_and_TV_5.json.gz``): keys
  ``overall, verified, reviewTime, reviewerID, asin, style, reviewerName, reviewText,
  summary, unixReviewTime, vote, image``; ``vote, style, image`` and even ``reviewText`` may
  be absent.

Both review formats are strict JSON (checked on the heads of both Movies & TV 5-core files);
only the 2014 *metadata* files are Python dict literals, which these readers do not accept.

DocEnt (Zemlyanskiy et al., EACL 2021, section 4.4) pre-processing, in order: drop reviews
under 5 words, drop movies with under 5 reviews ("applied after de-duplication and
aggregation"), split reviews into sentences, remove the movie's name from its reviews.
The files are GBs, so everything here streams: one pass counts reviews per entity
(:func:`select_entities`), a second pass yields sentences (:func:`iter_entity_sentences`).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from data_pipelines.errors import DataError
from data_pipelines.text import count_words, remove_entity_name, split_sentences
from embedding_core import storage

MIN_WORDS = 5
"""DocEnt: reviews shorter than 5 words are dropped (section 4.4)."""
MIN_REVIEWS = 5
"""DocEnt: movies with fewer than 5 reviews are dropped (section 4.4)."""

_GZIP_MAGIC = b"\x1f\x8b"

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class AmazonReview:
    """One review, in either file format.

    Attributes:
      asin: the product id (Amazon Standard Identification Number).
      text: ``reviewText``.
      reviewer_id: ``reviewerID``, None if absent.
      summary: the review title (``summary``), None if absent.
      overall: the star rating 1.0 to 5.0 (``overall``), None if absent.
      unix_review_time: seconds since 1970-01-01 UTC (``unixReviewTime``), None if absent.
      line: 1-based line of the review in its file (of the decompressed text for gzip).
    """

    asin: str
    text: str
    reviewer_id: str | None
    summary: str | None
    overall: float | None
    unix_review_time: int | None
    line: int


def open_maybe_gzip(path: PathLike) -> IO[bytes]:
    """Opens a file (local or ``gs://``) for binary reading, through gzip when it starts with
    the gzip magic bytes."""
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
    """``(1-based line, bytes)`` of a file; a damaged gzip stream becomes a DataError that
    names the file and the line where reading stopped."""
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


def iter_amazon_reviews(
    path: PathLike,
    *,
    skip_invalid: bool = False,
    counts: Counter[str] | None = None,
) -> Iterator[AmazonReview]:
    """Streams the reviews of one JSON-lines file (2014 or 2018 format, plain or gzip).

    Lines are read lazily; blank lines are ignored.

    Args:
      path: the review file.
      skip_invalid: skip (and count) a review without ``reviewText`` (absent or null)
        instead of raising.
      counts: if given, updated while iterating: ``"lines"`` (non-blank lines read) and
        ``"missing_review_text"`` (reviews skipped for it).

    Yields:
      :class:`AmazonReview` in file order.

    Raises:
      DataError: invalid UTF-8, a line that is not a JSON object, a missing or empty
        ``asin``, a field of the wrong type (``reviewText``, ``summary``, ``reviewerID``
        not strings, ``overall`` not a number, ``unixReviewTime`` not an integer), or a
        missing ``reviewText`` unless ``skip_invalid``; each names the file and line.
      FileNotFoundError: the file does not exist.
      DataError: a corrupt or truncated gzip file (named, with the last line read).
    """
    counts = counts if counts is not None else Counter()
    with open_maybe_gzip(path) as raw:
        for line_no, raw_line in _lines(raw, path):
            try:
                text = raw_line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(path, line_no, None, f"invalid UTF-8: {err.reason}") from None
            if not text.strip():
                continue
            counts["lines"] += 1
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                hint = (
                    " (this looks like a Python dict literal, the format of the 2014 metadata "
                    "files, not of review files)" if text.lstrip().startswith("{'") else ""
                )
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
                asin=asin,
                text=review_text,
                reviewer_id=_optional(record, "reviewerID", (str,), path, line_no),
                summary=_optional(record, "summary", (str,), path, line_no),
                overall=None if overall is None else float(overall),
                unix_review_time=_optional(record, "unixReviewTime", (int,), path, line_no),
                line=line_no,
            )


class EntityVocab:
    """Entity keys (ASINs, canonical ids) with stable integer ids.

    Ids are positions in the sorted (Python string order) list of distinct keys, so the same
    set of keys always gives the same ids, whatever order the keys arrived in. Saved as a
    UTF-8 text file with one key per line; line ``i`` (1-based) holds id ``i - 1``.
    """

    def __init__(self, keys: Iterable[str]):
        """Builds the vocabulary from any iterable of keys (duplicates are merged).

        Raises:
          ValueError: an empty key, or a key holding a line break (it could not be saved).
        """
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
        """All keys in id order."""
        return self._keys

    def id_of(self, key: str) -> int:
        """The id of ``key``. Raises KeyError (naming the key) for an unknown key."""
        try:
            return self._ids[key]
        except KeyError:
            raise KeyError(
                f"entity {key!r} is not in the vocabulary ({len(self)} entities)"
            ) from None

    def key_of(self, entity_id: int) -> str:
        """The key of ``entity_id``. Raises IndexError for an id outside ``[0, len)``."""
        if not 0 <= entity_id < len(self._keys):
            raise IndexError(f"entity id {entity_id} outside [0, {len(self._keys)})")
        return self._keys[entity_id]

    def save(self, path: PathLike) -> None:
        """Writes the keys, one per line, atomically (temp file in the same folder, then rename)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with open(fd, "w", encoding="utf-8", newline="\n") as f:
                f.writelines(f"{key}\n" for key in self._keys)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: PathLike) -> EntityVocab:
        """Reads a file written by :meth:`save`.

        Raises:
          DataError: invalid UTF-8; an empty line, a key with a carriage return, or keys not
            in strictly increasing order (a hand-edited file whose ids would shift); names
            the line.
          FileNotFoundError: the file does not exist.
        """
        data = storage.as_path(path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            raise DataError(path, line, "key", f"invalid UTF-8: {err.reason}") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, key in enumerate(lines):
            if not key or "\r" in key:
                raise DataError(path, i + 1, "key", "empty key or carriage return in the line")
            if i and key <= lines[i - 1]:
                raise DataError(
                    path, i + 1, "key",
                    f"keys must be sorted and distinct; {key!r} follows {lines[i - 1]!r}",
                )
        return cls(lines)


@dataclasses.dataclass
class ReviewCorpusStats:
    """Counts of the DocEnt review filters (filled by :func:`select_entities` and
    :func:`iter_entity_sentences`).

    Attributes:
      reviews_read: non-blank lines read.
      missing_review_text: reviews skipped for having no ``reviewText``.
      duplicates_dropped: exact repeats of (reviewer, entity, text) after aggregation.
      unmapped_dropped: reviews whose ASIN has no entity in ``entity_of``.
      short_reviews_dropped: reviews under ``min_words`` words.
      entities_seen: distinct entities among the remaining reviews.
      entities_kept: entities with at least ``min_reviews`` remaining reviews.
      reviews_kept: remaining reviews of kept entities.
      sentences: sentences yielded (after name removal, empty ones excluded).
      sentences_emptied: sentences that name removal left empty (not yielded).
    """

    reviews_read: int = 0
    missing_review_text: int = 0
    duplicates_dropped: int = 0
    unmapped_dropped: int = 0
    short_reviews_dropped: int = 0
    entities_seen: int = 0
    entities_kept: int = 0
    reviews_kept: int = 0
    sentences: int = 0
    sentences_emptied: int = 0


def _as_paths(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    return list(paths)


def _filtered_reviews(
    paths: list[PathLike],
    *,
    min_words: int,
    entity_of: Mapping[str, str] | None,
    deduplicate: bool,
    skip_invalid: bool,
    stats: ReviewCorpusStats,
) -> Iterator[tuple[str, AmazonReview]]:
    """Yields (entity key, review) for reviews passing the per-review filters."""
    seen: set[bytes] = set()
    for path in paths:
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
                # The same review is often listed under several editions (ASINs) of one
                # movie; after aggregation to one entity it is a duplicate. A 16-byte digest
                # keeps the set small for millions of reviews.
                digest = hashlib.blake2b(
                    "\x1f".join((review.reviewer_id or "", entity, review.text)).encode(),
                    digest_size=16,
                ).digest()
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


def select_entities(
    paths: PathLike | Sequence[PathLike],
    *,
    min_words: int = MIN_WORDS,
    min_reviews: int = MIN_REVIEWS,
    entity_of: Mapping[str, str] | None = None,
    deduplicate: bool = True,
    skip_invalid: bool = False,
) -> tuple[EntityVocab, ReviewCorpusStats]:
    """First pass: the entities that keep at least ``min_reviews`` reviews after filtering.

    Per review, in order: skip a review without text (``skip_invalid``), map its ASIN to an
    entity (``entity_of``; the ASIN itself when None; unmapped reviews are dropped),
    drop an exact duplicate (same reviewer, entity and text; ``deduplicate``), drop a review
    under ``min_words`` words (:func:`~data_pipelines.text.count_words`). Then entities with
    fewer than ``min_reviews`` remaining reviews are dropped (DocEnt section 4.4; the paper's
    "de-duplication and aggregation" reading is ours).

    Args:
      paths: one review file or several (read in order; duplicates are found across files).
      min_words: DocEnt's 5.
      min_reviews: DocEnt's 5.
      entity_of: ASIN -> entity key (e.g. ASIN -> ``canon_asin`` of Reviews2Movielens to
        aggregate editions of one movie); None keeps each ASIN as its own entity.
      deduplicate: drop exact duplicate reviews.
      skip_invalid: count and skip reviews without ``reviewText`` instead of raising.

    Returns:
      ``(vocab, stats)``: the kept entities and the counts up to ``reviews_kept``.

    Raises:
      DataError: see :func:`iter_amazon_reviews`.
    """
    stats = ReviewCorpusStats()
    per_entity: Counter[str] = Counter(
        entity
        for entity, _ in _filtered_reviews(
            _as_paths(paths), min_words=min_words, entity_of=entity_of,
            deduplicate=deduplicate, skip_invalid=skip_invalid, stats=stats,
        )
    )
    vocab = EntityVocab(e for e, n in per_entity.items() if n >= min_reviews)
    stats.entities_seen = len(per_entity)
    stats.entities_kept = len(vocab)
    stats.reviews_kept = sum(per_entity[e] for e in vocab.keys)
    return vocab, stats


def iter_entity_sentences(
    paths: PathLike | Sequence[PathLike],
    vocab: EntityVocab,
    *,
    min_words: int = MIN_WORDS,
    entity_of: Mapping[str, str] | None = None,
    names: Mapping[str, str] | None = None,
    deduplicate: bool = True,
    skip_invalid: bool = False,
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
    stats: ReviewCorpusStats | None = None,
) -> Iterator[tuple[int, str]]:
    """Second pass: streams ``(entity_id, sentence)`` for the reviews of the entities in ``vocab``.

    Applies the same per-review filters as :func:`select_entities` (pass the same
    ``min_words``, ``entity_of``, ``deduplicate``, ``skip_invalid``), splits each kept review
    into sentences and removes the entity's own name (``names[entity]``, when given) with
    :func:`~data_pipelines.text.remove_entity_name`; sentences left empty are not yielded.

    Args:
      paths: the same files as for :func:`select_entities`.
      vocab: the entities to keep; ids are ``vocab.id_of(entity)``.
      names: entity key -> display name (e.g. the ``name`` of Reviews2Movielens); entities
        without a name keep their sentences unchanged.
      sentence_splitter: text -> sentences; default pySBD.
      stats: if given, ``sentences`` and ``sentences_emptied`` are added to it.

    Yields:
      ``(entity_id, sentence)`` in file order.

    Raises:
      DataError: see :func:`iter_amazon_reviews`.
    """
    stats = stats if stats is not None else ReviewCorpusStats()
    scratch = ReviewCorpusStats()  # pass-1 counters are not counted twice
    for entity, review in _filtered_reviews(
        _as_paths(paths), min_words=min_words, entity_of=entity_of,
        deduplicate=deduplicate, skip_invalid=skip_invalid, stats=scratch,
    ):
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
    """A materialised review corpus (for small inputs; stream the two passes for large ones).

    Attributes:
      vocab: the kept entities.
      sentences: ``(entity_id, sentence)`` pairs in file order.
      stats: all filter counts.
    """

    vocab: EntityVocab
    sentences: list[tuple[int, str]]
    stats: ReviewCorpusStats


def build_review_corpus(
    paths: PathLike | Sequence[PathLike],
    *,
    min_words: int = MIN_WORDS,
    min_reviews: int = MIN_REVIEWS,
    entity_of: Mapping[str, str] | None = None,
    names: Mapping[str, str] | None = None,
    deduplicate: bool = True,
    skip_invalid: bool = False,
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
) -> ReviewCorpus:
    """Both passes (:func:`select_entities`, then :func:`iter_entity_sentences`) into lists.

    Arguments as for those two functions; the result holds every sentence in memory.

    Raises:
      DataError: see :func:`iter_amazon_reviews`.
    """
    vocab, stats = select_entities(
        paths, min_words=min_words, min_reviews=min_reviews, entity_of=entity_of,
        deduplicate=deduplicate, skip_invalid=skip_invalid,
    )
    sentences = list(
        iter_entity_sentences(
            paths, vocab, min_words=min_words, entity_of=entity_of, names=names,
            deduplicate=deduplicate, skip_invalid=skip_invalid,
            sentence_splitter=sentence_splitter, stats=stats,
        )
    )
    return ReviewCorpus(vocab=vocab, sentences=sentences, stats=stats)
