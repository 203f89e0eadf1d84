"""DocEnt MovieLens tag prediction of a trained workdir (sec. 5; ``docs/docent_tags.md``)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from etils import epath

from data_pipelines.paths import data_dir
from docent_jax import tag_eval
from docent_jax.corpora import movielens
from docent_jax.review_data import entity_movielens_ids
from docent_jax.tag_finetune import FinetuneSettings, TagScorer, finetune_closed, finetune_open
from embedding_core import multihost, write_json
from embedding_core.storage import storage

MODEL_NAMES = {"dual": "DocEnt-Dual", "full": "DocEnt-Full", "hybrid": "DocEnt-Hybrid"}
PAPER_HELDOUT_MOVIES = 1000
PAPER_HELDOUT_TAGS = 500
# Printed columns: header, tag_metrics key, factor (percent, except AUC).
TABLE = (("MAP", "map", 100.0), ("AUC", "auc", 1.0), ("P@1", "precision@1", 100.0),
         ("P@5", "precision@5", 100.0), ("P@10", "precision@10", 100.0),
         ("NDCG@10", "ndcg@10", 100.0), ("NDCGlog@10", "ndcg_log@10", 100.0))
PROBE = "linear probe on frozen entity vectors"
COSINE = "tag-text cosine (frozen)"


@dataclasses.dataclass(frozen=True)
class TagTask:
    """A model's movie x tag matrix: ``movie_ids``, ``entity_rows`` int64, ``tags``, ``counts``
    ``[n_movies, n_tags]`` int32, ``applications``."""

    movie_ids: list[int]
    entity_rows: np.ndarray
    tags: list[str]
    counts: np.ndarray
    applications: list[movielens.TagApplication]
    description: str


def movielens_folder(config: ml_collections.ConfigDict) -> epath.Path:
    """``config.tag_movielens_dir`` or the shipped ``data/movielens``; FileNotFoundError."""
    given = str(config.get("tag_movielens_dir", "") or "").strip()
    folder = storage.as_path(given) if given else storage.as_path(data_dir() / "movielens")
    for name in ("tags.csv", "genome-tags.csv"):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"config.tag_movielens_dir: {folder / name} is missing; pass "
                "--config.tag_movielens_dir=DIR with the MovieLens tags.csv and genome-tags.csv "
                "(ml-latest), or leave it empty for the shipped data/movielens")
    return folder


def build_tag_task(config: ml_collections.ConfigDict, entity_ids: Sequence[str]) -> TagTask:
    """The movie x tag counts over a model's entities (a shared MovieLens id keeps the first).
    ValueError: not an Amazon-trained run, under 2 movies or tags; FileNotFoundError, DataError."""
    ml_ids = entity_movielens_ids(config, entity_ids)
    folder = movielens_folder(config)
    applications = movielens.read_tags(folder / "tags.csv")
    vocab = [g.tag for g in movielens.read_genome_tags(folder / "genome-tags.csv")]
    first: dict[int, int] = {}
    for row, ml_id in enumerate(ml_ids):
        if ml_id is not None:
            first.setdefault(ml_id, row)
    with_id = sum(i is not None for i in ml_ids)
    candidates = list(first)
    counts, stats = movielens.tag_count_matrix(applications, candidates, vocab,
                                               skip_unknown_movies=True)
    rows = np.flatnonzero(counts.sum(axis=1) > 0)
    cols = np.flatnonzero(counts[rows].sum(axis=0) > 0)
    shared = with_id - len(first)
    description = (
        f"{len(entity_ids)} entities, {with_id} with a MovieLens id"
        + (f" ({shared} sharing one with an earlier entity, left out)" if shared else "")
        + f", {len(rows)} of them with genome-tag applications in {folder}; {len(cols)} of "
        f"{len(vocab)} genome tags applied to them ({stats.counted} applications counted, "
        f"{stats.tag_not_in_vocab} with a tag outside the genome vocabulary skipped)")
    if len(rows) < 2 or len(cols) < 2:
        raise ValueError(f"tag prediction needs at least 2 movies and 2 tags with "
                         f"applications; got {len(rows)} movies and {len(cols)} tags: "
                         f"{description}")
    return TagTask(movie_ids=[candidates[r] for r in rows],
                   entity_rows=np.asarray([first[candidates[r]] for r in rows], np.int64),
                   tags=[vocab[c] for c in cols],
                   counts=counts[np.ix_(rows, cols)].astype(np.int32),
                   applications=applications, description=description)


def heldout_split(n: int, requested: int, max_share: float, seed: Sequence[int], what: str,
                  paper: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``(train, held, note)`` sorted int64; ``held = default_rng(seed).permutation(n)[:k]``, ``k
    = min(requested, max(1, floor(max_share * n)), n - 1)``; ValueError for ``n < 2``."""
    if n < 2:
        raise ValueError(f"need at least 2 {what} to hold some out, got {n}")
    cap = max(1, int(math.floor(max_share * n)))
    k = min(int(requested), cap, n - 1)
    perm = np.random.default_rng(list(seed)).permutation(n)
    held, train = np.sort(perm[:k]), np.sort(perm[k:])
    note = f"{k} of {n} {what} held out"
    if k < requested:
        limit = f"at most {max_share:g} x {n}" if k == cap else "all but one"
        note += f" (asked for {requested}, paper {paper:,}; clipped to {limit})"
    return train, held, note


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN -> None, numpy scalars -> Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(float(value)) else float(value)
    return int(value) if isinstance(value, np.integer) else value


def format_tag_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    """Fixed-width table: MAP, P@K, NDCG in percent, AUC in [0, 1], n/a for undefined."""
    width = max(len(name) for name in rows) + 2
    header = "model".ljust(width) + "".join(f"{h:>12}" for h, _, _ in TABLE)
    lines = [header, "-" * len(header)]
    for name, m in rows.items():
        cells = []
        for _, key, factor in TABLE:
            v = float("nan") if m.get(key) is None else float(m[key])
            cells.append(f"{'n/a':>12}" if math.isnan(v) else
                         f"{v * factor:>12.{3 if factor == 1.0 else 2}f}")
        lines.append(name.ljust(width) + "".join(cells))
    return "\n".join(lines)


def _human(folds: list[movielens.HumanCVFold] | None, reason: str | None, rows: np.ndarray,
           cols: np.ndarray, threshold: int, model_scores: Mapping[str, np.ndarray],
           ks: Sequence[int]) -> dict:
    """Human CV on one evaluation block, models scored against the same fold labels."""
    if folds is None:
        return {"threshold": threshold, "defined": False, "reason": reason, "rows": {}}
    block = [movielens.HumanCVFold(f.users, f.held_in[np.ix_(rows, cols)],
                                   f.others[np.ix_(rows, cols)]) for f in folds]
    positives = [int((f.held_in > threshold).sum()) for f in block]
    if not any(positives):
        return {"threshold": threshold, "defined": False, "positives_per_fold": positives,
                "reason": f"no (movie, tag) cell of this block has more than {threshold} users "
                          "inside one fold", "rows": {}}
    result = tag_eval.human_baseline(block, threshold=threshold, ks=ks, model_scores=model_scores)
    return {"threshold": threshold, "defined": True, "positives_per_fold": positives,
            "reason": None, "rows": {name: r["mean"] for name, r in result.items()}}


def evaluate_tags(ranker, config: ml_collections.ConfigDict | None = None, *,
                  progress: bool = False, ks: Sequence[int] = tag_eval.DEFAULT_KS) -> dict:
    """``tags.json``'s dict of an Amazon-run ranker: ValueError, FileNotFoundError, DataError."""
    config = ranker.config if config is None else config
    task = build_tag_task(config, ranker.entity_ids)
    name = MODEL_NAMES.get(ranker.variant, f"DocEnt-{ranker.variant}")
    settings = FinetuneSettings.from_config(config, progress=progress)
    share, seed = float(config.tag_max_heldout_share), int(config.split_seed)
    threshold, train_threshold = int(config.tag_threshold), int(config.tag_train_threshold)
    n_movies, n_tags = task.counts.shape
    train_m, test_m, movie_note = heldout_split(
        n_movies, int(config.tag_heldout_movies), share, (seed, 1), "movies", PAPER_HELDOUT_MOVIES)
    train_t, test_t, tag_note = heldout_split(
        n_tags, int(config.tag_heldout_tags), share, (seed, 2), "tags", PAPER_HELDOUT_TAGS)
    scorer = TagScorer.for_ranker(ranker, min(settings.batch_size, n_tags))
    entities, encode = ranker.entity_embeddings()[task.entity_rows], ranker.encode
    counts, all_tags = task.counts, np.arange(n_tags)
    # Closed vocabulary: held-out movies x all tags.
    closed = finetune_closed(scorer, task.tags, counts, task.entity_rows, train_m, test_m,
                             train_threshold=train_threshold, settings=settings)
    probe = tag_eval.closed_vocab_eval(entities, counts, train_m, test_m, threshold=threshold,
                                       train_threshold=train_threshold, ks=ks)
    cosine_c = tag_eval.open_vocab_eval(entities[test_m], task.tags, encode, counts[test_m],
                                        all_tags, threshold=threshold, ks=ks)
    closed_scores = {f"{name} fine-tuned": closed.scores, f"{name} zero-shot": closed.zero_shot,
                     PROBE: probe["scores"], COSINE: cosine_c["scores"]}
    # Open vocabulary: all movies x held-out tags.
    opened = finetune_open(scorer, task.tags, counts, task.entity_rows, train_t, test_t,
                           train_threshold=train_threshold, settings=settings)
    cosine_o = tag_eval.open_vocab_eval(entities, task.tags, encode, counts, test_t,
                                        threshold=threshold, ks=ks)
    open_scores = {f"{name} fine-tuned": opened.scores, f"{name} zero-shot": opened.zero_shot,
                   COSINE: cosine_o["scores"]}

    human_threshold = int(config.tag_human_threshold)
    users = len({a.user_id for a in task.applications})
    folds, reason = None, f"{users} tagging users, fewer than {movielens.HUMAN_CV_FOLDS} folds"
    if users >= movielens.HUMAN_CV_FOLDS:
        folds, reason = movielens.human_cv_folds(task.applications, task.movie_ids, task.tags,
                                                 skip_unknown_movies=True), None

    def setting(scores: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray, note: str,
                result) -> dict:
        block = counts[np.ix_(rows, cols)]
        return {
            "split": note, "movies": len(rows), "tags": len(cols),
            "rows": {k: tag_eval.tag_metrics(v, block, threshold, ks) for k, v in scores.items()},
            "train_bce_before": result.loss_before, "train_bce_after": result.loss_after,
            "human": _human(folds, reason, rows, cols, human_threshold, scores, ks)}

    out = {
        "protocol": {
            "model": name, "variant": ranker.variant, "step": ranker.step,
            "data": task.description, "movies": n_movies, "tags": n_tags,
            "threshold": threshold, "train_threshold": train_threshold,
            "human_threshold": human_threshold, "split_seed": seed,
            "max_heldout_share": share,
            "finetuning": {k: v for k, v in dataclasses.asdict(settings).items()
                           if k != "progress"},
            "heldout_movie_ids": [task.movie_ids[i] for i in test_m],
            "heldout_tags": [task.tags[j] for j in test_t]},
        "closed_vocabulary": setting(closed_scores, test_m, all_tags, movie_note, closed),
        "open_vocabulary": setting(open_scores, np.arange(n_movies), test_t, tag_note, opened),
    }
    return _clean(out)


def print_report(result: Mapping[str, Any]) -> None:
    """Prints one table per setting (and the human cross-validation where defined)."""
    protocol = result["protocol"]
    print(f"\nTag prediction of {protocol['model']} (step {protocol['step']}): "
          f"{protocol['data']}")
    titles = {"closed_vocabulary": "Closed vocabulary (held-out movies x all tags)",
              "open_vocabulary": "Open vocabulary (all movies x held-out tags, scored through "
                                 "their text)"}
    for key, title in titles.items():
        part = result[key]
        print(f"\n{title}: {part['split']}; labels count > {protocol['threshold']}; "
              f"fine-tuning BCE on the training block {part['train_bce_before']:.4f} -> "
              f"{part['train_bce_after']:.4f}")
        print(format_tag_table(part["rows"]))
        if not any((row or {}).get("movies_with_positive") for row in part["rows"].values()):
            print(f"n/a: no evaluated movie has a tag applied by more than "
                  f"{protocol['threshold']} users, so every metric is undefined; lower "
                  "--config.tag_threshold or use a denser MovieLens release (ml-latest)")
        human = part["human"]
        if human["defined"]:
            print(f"human 3-fold cross-validation, labels count > {human['threshold']} "
                  f"inside a fold (models scored against the same fold labels):")
            print(format_tag_table(human["rows"]))
        else:
            print(f"human cross-validation (count > {human['threshold']}): not defined, "
                  f"{human['reason']}")


def _with_overrides(config: ml_collections.ConfigDict,
                    overrides: Mapping[str, Any] | None) -> ml_collections.ConfigDict:
    if not overrides:
        return config
    from docent_jax.configs import validate_config

    bad = sorted(k for k in overrides if not k.startswith("tag_"))
    if bad:
        raise ValueError(f"an evaluation may change only the tag_* fields, not {bad} (they "
                         "describe the trained run)")
    config = config.copy_and_resolve_references()
    for key, value in overrides.items():
        if key not in config:
            raise ValueError(f"config.{key} is not a DocEnt field")
        config[key] = value
    validate_config(config, saved=True)  # a loaded run: retired fields may remain
    return config


def evaluate_tags_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                          progress: bool = True,
                          overrides: Mapping[str, Any] | None = None) -> dict:
    """:func:`evaluate_tags` of a checkpoint (``tag_*`` overrides), written to
    ``eval/tags.json``."""
    from docent_jax.inference import load

    ranker = load(workdir) if step is None else load(workdir, step=step)
    config = _with_overrides(ranker.config, overrides)
    result = evaluate_tags(ranker, config, progress=progress)
    result["protocol"]["workdir"] = storage.display(workdir)
    path = storage.as_path(workdir) / "eval" / "tags.json"
    if multihost.is_primary():  # every process holds the same result; one writes it
        write_json(path, result)
        print_report(result)
        print(f"\nwrote {path}")
    return result


__all__ = ["TagTask", "build_tag_task", "evaluate_tags", "evaluate_tags_workdir",
           "format_tag_table", "heldout_split", "movielens_folder", "print_report"]
