"""MovieLens readers and the tag-count ground truth of DocEnt's tag prediction.

Files (GroupLens CSV with a header; Harper & Konstan, ACM TiiS 2015), shipped in
``data/movielens`` (ml-latest-small, 2018-09-26, plus the Tag Genome vocabulary):

- ``movies.csv``: ``movieId,title,genres`` (genres joined by ``|``).
- ``tags.csv``: ``userId,movieId,tag,timestamp`` (one tag application per row).
- ``links.csv``: ``movieId,imdbId,tmdbId`` (``tmdbId`` may be empty).
- ``genome-tags.csv``: ``tagId,tag`` (the 1,128 Tag Genome tags).

DocEnt (Zemlyanskiy et al., EACL 2021) scores a movie x tag matrix; the ground truth of a
(movie, tag) cell is the number of users who applied the tag (authors' evaluation notebooks,
github urikz/docent, ``MoviesHoldoutEval.ipynb``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence

import numpy as np
from etils import epath

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.errors import DataError
from data_pipelines.paths import data_dir
from embedding_core import storage

PathLike = str | os.PathLike[str]

HUMAN_CV_SEED = 31415
"""Seed of the authors' human cross-validation user permutation (``np.random.seed``)."""
HUMAN_CV_FOLDS = 3


@dataclasses.dataclass(frozen=True)
class Movie:
    """A row of ``movies.csv``: id, title (with year, e.g. ``"Toy Story (1995)"``), genres."""

    movie_id: int
    title: str
    genres: tuple[str, ...]
    line: int


@dataclasses.dataclass(frozen=True)
class TagApplication:
    """A row of ``tags.csv``: a user applied ``tag`` to a movie at ``timestamp`` (Unix seconds).

    ``path`` and ``line`` locate the row for error messages.
    """

    user_id: int
    movie_id: int
    tag: str
    timestamp: int
    path: str
    line: int


@dataclasses.dataclass(frozen=True)
class Link:
    """A row of ``links.csv``: IMDb id as written (digits with leading zeros, no ``tt``) and
    TMDB id (None when empty)."""

    movie_id: int
    imdb_id: str
    tmdb_id: int | None
    line: int


@dataclasses.dataclass(frozen=True)
class GenomeTag:
    """A row of ``genome-tags.csv``."""

    tag_id: int
    tag: str
    line: int


@dataclasses.dataclass(frozen=True)
class TagCountStats:
    """What :func:`tag_count_matrix` did with the tag applications.

    Attributes:
      applications: rows given.
      counted: rows counted (a user counts once per cell, repeats included here).
      tag_not_in_vocab: rows whose tag is not in the vocabulary (skipped).
      movie_not_in_vocab: rows whose movie is not in ``movie_ids`` (skipped when allowed).
    """

    applications: int
    counted: int
    tag_not_in_vocab: int
    movie_not_in_vocab: int


def _movielens_path(path: PathLike | None, name: str) -> epath.Path:
    if path is not None:
        return storage.as_path(path)
    resolved = storage.as_path(data_dir() / "movielens" / name)
    if not resolved.is_file():
        raise FileNotFoundError(f"MovieLens file {resolved} is missing")
    return resolved


def _int(record: dict, column: str, path: PathLike) -> int:
    value = record[column]
    try:
        return int(value)
    except ValueError:
        raise DataError(
            path, record[LINE_KEY], column, f"expected an integer, got {value!r}"
        ) from None


def _unique(values: Iterable[tuple[object, int]], path: PathLike, column: str) -> None:
    first: dict[object, int] = {}
    for value, line in values:
        if value in first:
            raise DataError(path, line, column, f"{value!r} already on line {first[value]}")
        first[value] = line


def read_movies(path: PathLike | None = None) -> list[Movie]:
    """Reads ``movies.csv`` (default: the shipped one).

    Raises:
      DataError: a missing column or empty value, a non-integer or repeated ``movieId``
        (file, line, column); see also :func:`~data_pipelines.csv_reader.read_csv_records`.
    """
    path = _movielens_path(path, "movies.csv")
    movies = [
        Movie(
            movie_id=_int(r, "movieId", path),
            title=r["title"],
            genres=tuple(r["genres"].split("|")),
            line=r[LINE_KEY],
        )
        for r in read_csv_records(path, ("movieId", "title", "genres"))
    ]
    _unique(((m.movie_id, m.line) for m in movies), path, "movieId")
    return movies


def read_tags(path: PathLike | None = None) -> list[TagApplication]:
    """Reads ``tags.csv`` (default: the shipped one).

    Raises:
      DataError: a missing column or empty value, a non-integer ``userId``, ``movieId`` or
        ``timestamp`` (file, line, column).
    """
    path = _movielens_path(path, "tags.csv")
    return [
        TagApplication(
            user_id=_int(r, "userId", path),
            movie_id=_int(r, "movieId", path),
            tag=r["tag"],
            timestamp=_int(r, "timestamp", path),
            path=str(path),
            line=r[LINE_KEY],
        )
        for r in read_csv_records(path, ("userId", "movieId", "tag", "timestamp"))
    ]


def read_links(path: PathLike | None = None) -> list[Link]:
    """Reads ``links.csv`` (default: the shipped one); an empty ``tmdbId`` becomes None.

    Raises:
      DataError: a missing column, an empty ``movieId`` or ``imdbId``, a non-integer id, a
        repeated ``movieId`` (file, line, column).
    """
    path = _movielens_path(path, "links.csv")
    links = []
    for r in read_csv_records(path, ("movieId", "imdbId", "tmdbId"), allow_empty=("tmdbId",)):
        imdb = r["imdbId"]
        if not imdb.isdigit():
            raise DataError(path, r[LINE_KEY], "imdbId", f"expected digits, got {imdb!r}")
        links.append(
            Link(
                movie_id=_int(r, "movieId", path),
                imdb_id=imdb,
                tmdb_id=_int(r, "tmdbId", path) if r["tmdbId"].strip() else None,
                line=r[LINE_KEY],
            )
        )
    _unique(((link.movie_id, link.line) for link in links), path, "movieId")
    return links


def read_genome_tags(path: PathLike | None = None) -> list[GenomeTag]:
    """Reads ``genome-tags.csv`` (default: the shipped 1,128-tag vocabulary).

    Raises:
      DataError: a non-integer or repeated ``tagId``; a tag repeated up to letter case
        (tags are matched case-insensitively, so it would be ambiguous).
    """
    path = _movielens_path(path, "genome-tags.csv")
    tags = [
        GenomeTag(tag_id=_int(r, "tagId", path), tag=r["tag"], line=r[LINE_KEY])
        for r in read_csv_records(path, ("tagId", "tag"))
    ]
    _unique(((t.tag_id, t.line) for t in tags), path, "tagId")
    _unique(((normalize_tag(t.tag), t.line) for t in tags), path, "tag")
    return tags


def normalize_tag(tag: str) -> str:
    """The matching key of a tag: surrounding whitespace stripped, case folded."""
    return tag.strip().casefold()


def tag_count_matrix(
    tags: Sequence[TagApplication],
    movie_ids: Sequence[int],
    tag_vocab: Sequence[str],
    *,
    skip_unknown_movies: bool = False,
) -> tuple[np.ndarray, TagCountStats]:
    """Movie x tag matrix of the number of distinct users who applied each tag.

    The ground truth of DocEnt's tag prediction (authors' notebook: a group-by count of
    users per (movie, tag)); a user who applied one tag to one movie twice (e.g. with other
    letter case) counts once. Tags are matched to the vocabulary by :func:`normalize_tag`
    (case-insensitive); rows whose tag is not in the vocabulary are counted and skipped.

    Args:
      tags: tag applications (e.g. :func:`read_tags`).
      movie_ids: MovieLens ids of the rows, in row order (distinct).
      tag_vocab: tag strings of the columns, in column order (e.g. the genome tags in
        ``tagId`` order); distinct after :func:`normalize_tag`.
      skip_unknown_movies: count and skip rows whose movie is not in ``movie_ids`` instead of
        raising.

    Returns:
      ``(counts, stats)``: ``counts`` is ``[len(movie_ids), len(tag_vocab)]`` int32.

    Raises:
      DataError: a tag application for a movie outside ``movie_ids`` (its file, line and
        ``movieId``) unless ``skip_unknown_movies``.
      ValueError: repeated movie ids or tags in the vocabularies.
    """
    row_of = {m: i for i, m in enumerate(movie_ids)}
    if len(row_of) != len(movie_ids):
        raise ValueError("movie_ids holds repeated ids")
    col_of = {normalize_tag(t): j for j, t in enumerate(tag_vocab)}
    if len(col_of) != len(tag_vocab):
        raise ValueError("tag_vocab holds tags that are equal after normalize_tag")
    cells: set[tuple[int, int, int]] = set()
    counted = not_in_vocab = unknown_movie = 0
    for t in tags:
        row = row_of.get(t.movie_id)
        if row is None:
            if not skip_unknown_movies:
                raise DataError(
                    t.path, t.line, "movieId",
                    f"movie {t.movie_id} is not in the movie vocabulary "
                    f"({len(row_of)} movies); pass skip_unknown_movies=True to skip it",
                )
            unknown_movie += 1
            continue
        col = col_of.get(normalize_tag(t.tag))
        if col is None:
            not_in_vocab += 1
            continue
        counted += 1
        cells.add((row, col, t.user_id))
    counts = np.zeros((len(movie_ids), len(tag_vocab)), dtype=np.int32)
    if cells:
        rows, cols, _ = np.array(list(cells), dtype=np.int64).T
        np.add.at(counts, (rows, cols), 1)
    return counts, TagCountStats(
        applications=len(tags),
        counted=counted,
        tag_not_in_vocab=not_in_vocab,
        movie_not_in_vocab=unknown_movie,
    )


@dataclasses.dataclass(frozen=True)
class HumanCVFold:
    """One fold of the human cross-validation.

    Attributes:
      users: the userIds of this fold (the "held-in" users), in permutation order.
      held_in: ``[n_movies, n_tags]`` int32 counts from this fold's users (the labels).
      others: ``[n_movies, n_tags]`` int32 counts from all other folds' users (the "human"
        predictor's scores).
    """

    users: np.ndarray
    held_in: np.ndarray
    others: np.ndarray


def human_cv_folds(
    tags: Sequence[TagApplication],
    movie_ids: Sequence[int],
    tag_vocab: Sequence[str],
    *,
    seed: int = HUMAN_CV_SEED,
    n_folds: int = HUMAN_CV_FOLDS,
    skip_unknown_movies: bool = False,
) -> list[HumanCVFold]:
    """The DocEnt authors' human cross-validation: users split into folds, each fold's tag
    counts predicted by the other folds' counts (``docs/docent.md``).

    Exactly: ``users = np.unique(user_ids)`` (sorted distinct userIds of all ``tags``, before
    any vocabulary filter); ``np.random.seed(seed); perm = np.random.permutation(users)``;
    ``folds = np.array_split(perm, n_folds)`` (the first ``len(users) % n_folds`` folds get
    one user more). For fold k, ``held_in`` = :func:`tag_count_matrix` of the applications by
    the users of fold k and ``others`` = the same for every other user; ``held_in + others``
    equals the matrix of all users. The paper thresholds the labels at count > 2 for this
    protocol; thresholds belong to the evaluation, not here.

    Note: ``np.random.seed`` sets NumPy's global legacy generator, as the authors' code did;
    the global state is restored before returning.

    Args:
      tags, movie_ids, tag_vocab, skip_unknown_movies: as for :func:`tag_count_matrix`.
      seed: 31415 in the authors' protocol.
      n_folds: 3 in the authors' protocol.

    Returns:
      ``n_folds`` :class:`HumanCVFold`.

    Raises:
      DataError: see :func:`tag_count_matrix`.
      ValueError: ``n_folds`` < 2 or more folds than users.
    """
    users = np.unique(np.array([t.user_id for t in tags], dtype=np.int64))
    if n_folds < 2 or n_folds > len(users):
        raise ValueError(f"n_folds must be in [2, {len(users)}] (the users), got {n_folds}")
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        permutation = np.random.permutation(users)
    finally:
        np.random.set_state(saved)
    fold_users = np.array_split(permutation, n_folds)
    folds = []
    for members in fold_users:
        inside = set(members.tolist())
        held_in, _ = tag_count_matrix(
            [t for t in tags if t.user_id in inside], movie_ids, tag_vocab,
            skip_unknown_movies=skip_unknown_movies,
        )
        others, _ = tag_count_matrix(
            [t for t in tags if t.user_id not in inside], movie_ids, tag_vocab,
            skip_unknown_movies=skip_unknown_movies,
        )
        folds.append(HumanCVFold(users=members, held_in=held_in, others=others))
    return folds
