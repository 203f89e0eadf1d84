"""Reader for Reviews2Movielens, ASIN -> MovieLens (sec. 4.2; ``docs/data.md``)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Container, Sequence
from typing import Literal

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.errors import DataError
from docent_jax.corpora import PathLike, csv_int

COLUMNS = ("asin", "canon_asin", "imdb_id", "movielens_id", "name", "imdb_url")


@dataclasses.dataclass(frozen=True)
class MovieMapping:
    """One row (``line`` 1-based); ``imdb_id``, ``imdb_url`` may be empty."""

    asin: str
    canon_asin: str
    imdb_id: str
    movielens_id: int
    name: str
    imdb_url: str
    line: int


@dataclasses.dataclass(frozen=True)
class MappingStats:
    """Rows read and rows skipped (``skip_invalid=True``) by :func:`read_reviews2movielens`."""

    rows: int
    unknown_movielens_ids: int
    unknown_asins: int


def read_reviews2movielens(path: PathLike, *, movie_ids: Container[int] | None = None,
                           known_asins: Container[str] | None = None,
                           asin_field: Literal["asin", "canon_asin"] = "asin",
                           skip_invalid: bool = False) -> tuple[list[MovieMapping], MappingStats]:
    """``(rows, stats)`` in file order, checked against ``movie_ids`` and ``known_asins`` (the
    ``asin_field`` column); ``skip_invalid`` drops unknown ones. DataError (file, line, column): a
    missing column or value, broken quoting, a non-integer id, a repeated ASIN, an unknown id."""
    rows: list[MovieMapping] = []
    records = read_csv_records(path, COLUMNS, allow_empty=("imdb_id", "imdb_url"))
    first_line: dict[str, int] = {}
    unknown: Counter[str] = Counter()
    for r in records:
        line = r[LINE_KEY]
        movielens_id = csv_int(r, "movielens_id", path)
        if r["asin"] in first_line:
            raise DataError(
                path, line, "asin", f"ASIN already mapped on line {first_line[r['asin']]}"
            )
        first_line[r["asin"]] = line
        if movie_ids is not None and movielens_id not in movie_ids:
            field = "movielens_id"
            what = f"MovieLens id {movielens_id} is not among the known movies"
        elif known_asins is not None and r[asin_field] not in known_asins:
            field, what = asin_field, f"ASIN {r[asin_field]!r} is not among the known ASINs"
        else:
            rows.append(MovieMapping(
                asin=r["asin"], canon_asin=r["canon_asin"], imdb_id=r["imdb_id"],
                movielens_id=movielens_id, name=r["name"], imdb_url=r["imdb_url"], line=line))
            continue
        if not skip_invalid:
            raise DataError(path, line, field, f"{what}; pass skip_invalid=True to skip such rows")
        unknown[field] += 1
    return rows, MappingStats(rows=len(records), unknown_movielens_ids=unknown["movielens_id"],
                              unknown_asins=unknown[asin_field])


def canonical_asins(rows: Sequence[MovieMapping]) -> dict[str, str]:
    """ASIN -> canonical ASIN (the ``entity_of`` of ``amazon.select_entities``)."""
    return {r.asin: r.canon_asin for r in rows}


def canonical_names(rows: Sequence[MovieMapping]) -> dict[str, str]:
    """Canonical ASIN -> movie name (the first row's name), the ``names`` for name removal."""
    names: dict[str, str] = {}
    for r in rows:
        names.setdefault(r.canon_asin, r.name)
    return names


def canonical_movielens_ids(rows: Sequence[MovieMapping]) -> dict[str, int]:
    """Canonical ASIN -> MovieLens id; ValueError (both lines named): two ids."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        prev = out.setdefault(r.canon_asin, (r.movielens_id, r.line))
        if prev[0] != r.movielens_id:
            raise ValueError(
                f"canonical ASIN {r.canon_asin!r} maps to MovieLens {prev[0]} (line {prev[1]}) "
                f"and {r.movielens_id} (line {r.line})"
            )
    return {k: v[0] for k, v in out.items()}
