"""MovieLens readers (``docs/data.md``) and DocEnt's tag-count ground truth (``docs/docent.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
from etils import epath

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.errors import DataError
from data_pipelines.paths import data_dir
from docent_jax.corpora import PathLike, csv_int
from embedding_core.storage import storage

HUMAN_CV_SEED = 31415  # the authors' np.random.seed of the human cross-validation
HUMAN_CV_FOLDS = 3


@dataclasses.dataclass(frozen=True)
class Movie:
    """A row of ``movies.csv``; ``title`` holds the year, e.g. ``"Toy Story (1995)"``."""

    movie_id: int
    title: str
    genres: tuple[str, ...]
    line: int


@dataclasses.dataclass(frozen=True)
class TagApplication:
    """A row of ``tags.csv`` (``timestamp`` in Unix seconds); ``path`` and ``line`` locate it."""

    user_id: int
    movie_id: int
    tag: str
    timestamp: int
    path: str
    line: int


@dataclasses.dataclass(frozen=True)
class Link:
    """A ``links.csv`` row: IMDb id as written (no ``tt``), TMDB id (None when empty)."""

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
    """What :func:`tag_count_matrix` did with the tag applications."""

    applications: int  # rows given
    counted: int  # rows counted (a user counts once per cell)
    tag_not_in_vocab: int  # skipped
    movie_not_in_vocab: int  # skipped (skip_unknown_movies)


def _records(path: PathLike | None, name: str, columns: tuple[str, ...], **options
             ) -> tuple[epath.Path, list[dict]]:
    """``(path, CSV records)`` of ``path``, default the shipped ``data/movielens/name``."""
    if path is None:
        path = storage.as_path(data_dir() / "movielens" / name)
        if not path.is_file():
            raise FileNotFoundError(f"MovieLens file {path} is missing")
    path = storage.as_path(path)
    return path, read_csv_records(path, columns, **options)


def _unique(values: Iterable[tuple[object, int]], path: PathLike, column: str) -> None:
    first: dict[object, int] = {}
    for value, line in values:
        if value in first:
            raise DataError(path, line, column, f"{value!r} already on line {first[value]}")
        first[value] = line


def read_movies(path: PathLike | None = None) -> list[Movie]:
    """``movies.csv`` (default shipped); DataError: a missing or empty value, a bad ``movieId``."""
    path, records = _records(path, "movies.csv", ("movieId", "title", "genres"))
    movies = [Movie(movie_id=csv_int(r, "movieId", path), title=r["title"],
                    genres=tuple(r["genres"].split("|")), line=r[LINE_KEY]) for r in records]
    _unique(((m.movie_id, m.line) for m in movies), path, "movieId")
    return movies


def read_tags(path: PathLike | None = None) -> list[TagApplication]:
    """``tags.csv`` (default shipped); DataError: a missing or empty value, a non-integer id."""
    path, records = _records(path, "tags.csv", ("userId", "movieId", "tag", "timestamp"))
    return [TagApplication(user_id=csv_int(r, "userId", path),
                           movie_id=csv_int(r, "movieId", path), tag=r["tag"],
                           timestamp=csv_int(r, "timestamp", path), path=str(path),
                           line=r[LINE_KEY]) for r in records]


def read_links(path: PathLike | None = None) -> list[Link]:
    """``links.csv`` (default shipped; empty ``tmdbId``: None); DataError: a missing or empty
    value, a non-integer or repeated id."""
    path, records = _records(path, "links.csv", ("movieId", "imdbId", "tmdbId"),
                             allow_empty=("tmdbId",))
    links = []
    for r in records:
        imdb = r["imdbId"]
        if not imdb.isdigit():
            raise DataError(path, r[LINE_KEY], "imdbId", f"expected digits, got {imdb!r}")
        links.append(Link(movie_id=csv_int(r, "movieId", path), imdb_id=imdb,
                          tmdb_id=csv_int(r, "tmdbId", path) if r["tmdbId"].strip() else None,
                          line=r[LINE_KEY]))
    _unique(((link.movie_id, link.line) for link in links), path, "movieId")
    return links


def read_genome_tags(path: PathLike | None = None) -> list[GenomeTag]:
    """``genome-tags.csv`` (default shipped); DataError: a bad or repeated ``tagId`` or tag."""
    path, records = _records(path, "genome-tags.csv", ("tagId", "tag"))
    tags = [GenomeTag(tag_id=csv_int(r, "tagId", path), tag=r["tag"], line=r[LINE_KEY])
            for r in records]
    _unique(((t.tag_id, t.line) for t in tags), path, "tagId")
    _unique(((normalize_tag(t.tag), t.line) for t in tags), path, "tag")
    return tags


def normalize_tag(tag: str) -> str:
    """The matching key of a tag: surrounding whitespace stripped, case folded."""
    return tag.strip().casefold()


def tag_count_matrix(tags: Sequence[TagApplication], movie_ids: Sequence[int],
                     tag_vocab: Sequence[str], *,
                     skip_unknown_movies: bool = False) -> tuple[np.ndarray, TagCountStats]:
    """``(counts [len(movie_ids), len(tag_vocab)] int32, stats)``: distinct users per (movie,
    tag), tags matched by :func:`normalize_tag` (others skipped). DataError: a movie outside
    ``movie_ids`` unless ``skip_unknown_movies``; ValueError: repeated ids or tags."""
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
                raise DataError(t.path, t.line, "movieId",
                                f"movie {t.movie_id} is not in the movie vocabulary "
                                f"({len(row_of)} movies); pass skip_unknown_movies=True to skip it")
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
    return counts, TagCountStats(applications=len(tags), counted=counted,
                                 tag_not_in_vocab=not_in_vocab,
                                 movie_not_in_vocab=unknown_movie)


@dataclasses.dataclass(frozen=True)
class HumanCVFold:
    """A human CV fold: ``users``, their ``held_in`` counts (labels), ``others`` (scores)."""

    users: np.ndarray
    held_in: np.ndarray
    others: np.ndarray


def human_cv_folds(tags: Sequence[TagApplication], movie_ids: Sequence[int],
                   tag_vocab: Sequence[str], *, seed: int = HUMAN_CV_SEED,
                   n_folds: int = HUMAN_CV_FOLDS,
                   skip_unknown_movies: bool = False) -> list[HumanCVFold]:
    """The DocEnt authors' human cross-validation (``docs/docent.md``); DataError, ValueError:
    ``n_folds`` < 2 or above the users."""
    users = np.unique(np.array([t.user_id for t in tags], dtype=np.int64))
    if n_folds < 2 or n_folds > len(users):
        raise ValueError(f"n_folds must be in [2, {len(users)}] (the users), got {n_folds}")
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        permutation = np.random.permutation(users)
    finally:
        np.random.set_state(saved)
    folds = []
    for members in np.array_split(permutation, n_folds):
        inside = set(members.tolist())
        held_in, others = (tag_count_matrix(
            [t for t in tags if (t.user_id in inside) == keep], movie_ids, tag_vocab,
            skip_unknown_movies=skip_unknown_movies)[0] for keep in (True, False))
        folds.append(HumanCVFold(users=members, held_in=held_in, others=others))
    return folds
