"""Resumable ``(system, seed)`` grids and paired-bootstrap result tables.

Each experiment script (``experiments/<paper>.py``) lists its runs as :class:`RunSpec`
objects. :func:`run_grid` gives every run its own workdir under ``--root`` and skips a run
whose ``scores.npz`` (its per-item test scores) already exists, so a grid can be stopped at
any time and resumed by running the same command again; an unfinished run resumes from its
own checkpoints (the training CLI/API does that). :func:`results_table` turns the per-item
scores into a Markdown table with paired-bootstrap 95% intervals
(:func:`embedding_core.evaluation.stats.paired_bootstrap`: the same resampled test items for both
systems) and :func:`write_results` writes ``experiments/results/<paper>.md`` with the raw
per-item scores beside it as ``<paper>.npz``, ending with each cell's commit and finish time
(``cell.json``, written beside ``scores.npz``), since a table may gather cells from several
sessions.

Seeds: a system trained with several seeds is reported as the mean over seeds; its interval
against the reference is computed on the seed-averaged per-item scores, so it covers
test-set sampling, not seed variance (the separate ``sd`` column).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from embedding_core.evaluation.stats import format_interval, paired_bootstrap
from embedding_core.storage import storage
from embedding_core.storage.files import write_bytes_atomic, write_text_atomic

Scores = dict[str, np.ndarray]
"""``{metric: [n_items] float64}`` per-item test scores of one run (e.g. 0/1 correctness,
average precision per query, recall@k hit per question)."""

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCORES_FILE = "scores.npz"
CELL_FILE = "cell.json"
"""Beside ``scores.npz``: the commit, finish time (UTC) and wall seconds of the run that wrote
it, so a table built from cells finished in earlier sessions says what code produced them."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of a grid.

    Attributes:
      system: the table row it belongs to (runs of one system differ by ``seed``).
      key: folder name of its workdir under the grid root (unique in the grid).
      run: ``workdir -> Scores``: trains into ``workdir`` (resuming what is there) and
        scores the test items; called only when ``workdir/scores.npz`` is missing.
      seed: training seed, or ``None`` for a system with nothing to train (a baseline).
    """

    system: str
    key: str
    run: Callable[[Path], Scores]
    seed: int | None = None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a bootstrap with no resample has no interval)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser(paper: str, description: str) -> argparse.ArgumentParser:
    """The arguments every experiment script shares (``--preset``, ``--root``, ...)."""
    p = argparse.ArgumentParser(
        prog=f"python -m experiments.{paper}", description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: a grid sized for 2 CPU cores (MiniLM, short runs); gpu: the "
                        "paper-sized grid (full epoch, paper batch sizes) for an accelerator")
    p.add_argument("--root", default=None, type=nonempty,
                   help="folder of the runs' workdirs (local or gs://); default "
                        f"workdirs/experiments/{paper}-<preset>. Re-running the same command "
                        "skips finished runs and resumes unfinished ones")
    p.add_argument("--results", default=str(RESULTS_DIR), type=nonempty,
                   help="where <paper>.md and <paper>.npz are written (default "
                        "experiments/results)")
    p.add_argument("--only", action="append", default=[],
                   help="run only the grid cells whose key contains this text (repeatable); "
                        "the table is still written from every finished cell")
    p.add_argument("--table-only", action="store_true",
                   help="run no cell: write the table from the cells finished so far (e.g. "
                        "while the grid runs in another process); the table names its seeds")
    p.add_argument("--num-samples", type=positive_int, default=10_000,
                   help="bootstrap resamples per interval (default 10000)")
    p.add_argument("--list", action="store_true", help="print the grid's cells and exit")
    return p


def nonempty(text: str) -> str:
    """argparse type of a path argument: an empty string is an error, not the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def main_of(paper: str, main: Callable[[], None]) -> None:
    """Runs an experiment's ``main`` with the core's error reporting: a bad path, a corrupt
    cell file or a failed write ends in one line naming it, exit 1 (``cli.user_errors``)."""
    from embedding_core.cli import user_errors

    with user_errors(f"python -m experiments.{paper}", "grid"):
        main()


def grid_root(args: argparse.Namespace, paper: str) -> Path:
    """``--root`` or ``workdirs/experiments/<paper>-<preset>``."""
    return storage.as_path(args.root or f"workdirs/experiments/{paper}-{args.preset}")


def command_line() -> str:
    """The command that ran this script, for the results file's header."""
    return "python -m " + " ".join(
        [shlex.quote(_module_name())] + [shlex.quote(a) for a in sys.argv[1:]])


def commit() -> str:
    """The checkout's short commit hash for a results header (``"unknown"`` outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def sign_verdict(interval, paper_difference: float) -> str:
    """``"holds"`` / ``"reversed"`` when the paired interval excludes 0 (same / other sign
    as the paper's difference), else ``"not resolved (interval covers 0)"``."""
    if interval.low > 0 or interval.high < 0:
        same = (interval.mean_difference > 0) == (paper_difference > 0)
        return "holds" if same else "reversed"
    return "not resolved (interval covers 0)"


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def save_scores(path, scores: Mapping[str, np.ndarray]) -> None:
    """Writes ``{metric: [n] array}`` as one ``.npz`` atomically (never a partial file)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, np.float64) for k, v in scores.items()})
    write_bytes_atomic(path, buf.getvalue())


def load_scores(path) -> Scores:
    """Reads a :func:`save_scores` file.

    Raises:
      ValueError: not a readable ``.npz`` of numeric arrays (names the file and the fix).
    """
    path = storage.as_path(path)
    try:
        with path.open("rb") as f:
            with np.load(io.BytesIO(f.read())) as z:
                scores = {k: np.asarray(z[k], np.float64) for k in z.files}
    except Exception as err:  # zip, pickle, dtype, OS errors alike: the file is unusable
        raise ValueError(
            f"{storage.display(path)}: not a readable scores file ({type(err).__name__}: "
            f"{err}); delete {storage.display(path.parent)} to run that cell again") from err
    bad = next((k for k, v in scores.items() if v.ndim == 0 or v.shape[0] == 0), None)
    if not scores or bad is not None:
        raise ValueError(f"{storage.display(path)}: "
                         + (f"{bad!r} holds no items" if scores else "holds no scores")
                         + f"; delete {storage.display(path.parent)} to run that cell again")
    return scores


def _agree(system: str, cells: Sequence[tuple[str, Scores]],
           optional: Callable[[str], bool]) -> list[Scores]:
    """The cells of one system with the keys they share: an ``optional`` key (raw cosines a
    later version kept) that some cells lack is dropped from all, with one printed line.

    Raises:
      ValueError: cells differ in a key that is not optional, or in an array's length.
    """
    shared = set.intersection(*(set(sc) for _, sc in cells))
    every = set().union(*(set(sc) for _, sc in cells))
    for key, sc in cells:
        missing = sorted(k for k in every - set(sc) if not optional(k))
        if missing:
            raise ValueError(f"cell {key} of {system!r} lacks {len(missing)} score(s) its "
                             f"other cells have (e.g. {missing[0]!r}); delete its folder "
                             "to run it again")
    for k in shared:
        lengths = {key: len(sc[k]) for key, sc in cells}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{system!r}: {k!r} has different lengths across cells "
                             f"{lengths}; a cell was scored on other data")
    dropped = sorted(every - shared)
    if dropped:
        lacking = ", ".join(key for key, sc in cells if not set(dropped) <= set(sc))
        print(f"{system}: cell(s) {lacking} kept no {dropped[0]!r} and {len(dropped) - 1} "
              "more optional score(s); the table leaves those out for this row", flush=True)
    return [{k: v for k, v in sc.items() if k in shared} for _, sc in cells]


def run_grid(specs: Sequence[RunSpec], root, *, only: Sequence[str] = (),
             table_only: bool = False, optional: Callable[[str], bool] = lambda k: False
             ) -> dict[str, list[tuple[int | None, Scores]]]:
    """Runs (or skips) every cell and collects the finished ones.

    Args:
      specs: the grid; keys must be unique.
      root: folder holding one workdir per cell (``root/<key>``).
      only: if given, cells whose key contains none of these strings are not run (their
        scores are still collected when already finished).
      table_only: run no cell; collect the finished ones (a table of a grid that is
        still running, or was stopped).
      optional: keys a system's cells may lack (kept only where all its cells hold them).

    Returns:
      ``{system: [(seed, scores), ...]}`` for the finished cells, in grid order.

    Raises:
      ValueError: duplicate keys; an ``only`` text that matches no key; an unreadable or
        inconsistent finished cell (:func:`load_scores`).
    """
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"grid keys must be unique; repeated: {dup}")
    unmatched = [o for o in only if not any(o in k for k in keys)]
    if unmatched:
        raise ValueError(f"--only {unmatched[0]!r} matches no cell of this grid (--list "
                         "prints them)")
    root = storage.as_path(root)
    if table_only and not root.is_dir():
        raise ValueError(f"--root {storage.display(root)} is not a folder: no cell to "
                         "table (run without --table-only to start the grid)")
    cells: dict[str, list[tuple[RunSpec, Scores]]] = {}
    for i, spec in enumerate(specs, 1):
        workdir = root / spec.key
        done = workdir / SCORES_FILE
        tag = f"[{i}/{len(specs)}] {spec.key}"
        if done.exists():
            print(f"{tag}: finished earlier, scores read from {storage.display(done)}",
                  flush=True)
        elif table_only or (only and not any(o in spec.key for o in only)):
            print(f"{tag}: not finished, not run ({'--table-only' if table_only else '--only'})",
                  flush=True)
            continue
        else:
            print(f"{tag}: running in {storage.display(workdir)}", flush=True)
            t0 = time.time()
            scores = spec.run(Path(str(workdir)) if not storage.is_remote(workdir)
                              else workdir)
            seconds = time.time() - t0
            write_text_atomic(workdir / CELL_FILE, json.dumps({
                "commit": commit(), "seconds": round(seconds),
                "finished": datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%d %H:%M UTC")}))
            save_scores(done, scores)  # last: its presence marks the cell finished
            print(f"{tag}: done in {seconds:.0f} s", flush=True)
        cells.setdefault(spec.system, []).append((spec, load_scores(done)))
    return {system: list(zip([sp.seed for sp, _ in runs],
                             _agree(system, [(sp.key, sc) for sp, sc in runs], optional),
                             strict=True))
            for system, runs in cells.items()}


def _cells_in_markdown(md: Path) -> dict[str, dict]:
    """``{key: cell.json fields}`` from a results file's "Cells" table (:func:`provenance`),
    a starred commit carrying its footnote as ``source``."""
    if not md.exists():
        return {}
    lines = md.read_text(encoding="utf-8", errors="replace").splitlines()
    if "## Cells" in lines:  # its footnotes, not a bullet list elsewhere in the file
        lines = lines[lines.index("## Cells"):]
    notes: dict[str, str] = {}  # the first of each mark: the footnotes follow the table
    for ln in (ln for ln in lines if ln.startswith("*") and " " in ln):
        notes.setdefault(*ln.split(" ", 1))
    cells = {}
    for number, ln in enumerate(lines, 1):
        parts = [p.strip() for p in ln.strip().strip("|").split("|")]
        if len(parts) == 4 and parts[1].startswith("`") and parts[3].endswith(" min"):
            commit, _, stars = parts[1][1:].partition("`")
            try:
                minutes = float(parts[3][:-4])
                seconds = round(minutes * 60)
                if minutes < 0:
                    raise ValueError("negative")
            except (ValueError, OverflowError):
                raise ValueError(f"{md}:{number}: Cells row {parts[0]!r} has wall time "
                                 f"{parts[3]!r}, not minutes") from None
            cells[parts[0]] = {"commit": commit, "finished": parts[2], "seconds": seconds}
            if stars in notes:
                cells[parts[0]]["source"] = notes[stars]
    return cells


def restore_cells(paper: str, specs: Sequence[RunSpec], root,
                  results_dir=RESULTS_DIR) -> list[str]:
    """Re-creates, under ``root``, the ``scores.npz`` and ``cell.json`` of cells that the
    committed ``<paper>.npz`` / ``<paper>.md`` hold but ``root`` does not (a grid finished in
    an earlier session or on another machine), so re-running the command skips them and the
    table keeps them. A cell is matched by its ``system`` and ``seed``.

    Returns:
      The restored keys.
    """
    results_dir, root = Path(str(results_dir)), storage.as_path(root)
    npz = results_dir / f"{paper}.npz"
    if not npz.exists():
        return []
    cells = _cells_in_markdown(results_dir / f"{paper}.md")
    restored = []
    with np.load(npz) as z:
        for spec in specs:
            done = root / spec.key / SCORES_FILE
            prefix = f"{spec.system}|seed={spec.seed}|"
            scores = {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}
            if not scores or done.exists():
                continue
            # The md's row as it was (its footnote too): the cell's provenance is unchanged.
            cell = cells.get(spec.key, {"commit": "unknown", "finished": "unknown",
                                        "seconds": 0,
                                        "source": f"restored from {paper}.npz, no Cells row"})
            write_text_atomic(root / spec.key / CELL_FILE, json.dumps(cell))
            save_scores(done, scores)
            restored.append(spec.key)
    if restored:
        print(f"restored {len(restored)} finished cell(s) from {npz}: {', '.join(restored)}")
    return restored


def macro_average_items(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenates per-item scores of several test sets, weighted so that their plain mean
    is the unweighted average of the sets' means (the papers' "Avg." column).

    Item ``i`` of set ``s`` (``n_s`` items, ``k`` sets, ``N`` items in all) becomes
    ``x_i * N / (k * n_s)``; resampling the concatenation then bootstraps the macro average.

    Raises:
      ValueError: no sets, or an empty set.
    """
    if not parts or any(len(p) == 0 for p in parts):
        raise ValueError("macro_average_items needs at least one non-empty set")
    total = sum(len(p) for p in parts)
    return np.concatenate([np.asarray(p, np.float64) * total / (len(parts) * len(p))
                           for p in parts])


def seed_mean(runs: Sequence[tuple[int | None, Scores]]) -> Scores:
    """Per-item mean over a system's seeds.

    Raises:
      ValueError: runs disagree on metrics or item counts.
    """
    metrics = set(runs[0][1])
    for _, s in runs:
        if set(s) != metrics:
            raise ValueError(f"runs of one system report different metrics: {sorted(metrics)} "
                             f"vs {sorted(s)}")
    return {m: np.mean(np.stack([s[m] for _, s in runs]), axis=0) for m in runs[0][1]}


def results_table(grid: Mapping[str, Sequence[tuple[int | None, Scores]]],
                  metrics: Sequence[str], *, reference: str | None, primary: str,
                  scale: float = 100.0, digits: int = 2, num_samples: int = 10_000,
                  paper: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """A Markdown table: one row per system, each metric's mean over items (and seeds),
    the seeds' standard deviation of ``primary``, and the paired-bootstrap 95% interval of
    ``primary`` minus the reference system's.

    Args:
      grid: from :func:`run_grid`.
      metrics: columns (keys of the scores), each shown as ``scale * mean``.
      reference: the system every interval is taken against (``None``: no intervals).
      primary: the metric of the interval and of the sd column.
      paper: optional ``{system: {metric: value}}`` of published numbers (already scaled),
        shown in an extra "paper" column for ``primary``.

    Raises:
      ValueError: the reference is missing, or a system's items differ in number from the
        reference's (not paired).
    """
    if reference is not None and reference not in grid:
        raise ValueError(f"reference system {reference!r} has no finished run")
    ref = seed_mean(grid[reference]) if reference is not None else None
    head = ["system", "seeds", *metrics, f"sd({primary}) over seeds"]
    if reference is not None:
        head.append(f"{primary} − {reference} [95% CI]")
    if paper:
        head.append(f"paper {primary}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, runs in grid.items():
        mean = seed_mean(runs)
        seeds = [s for s, _ in runs if s is not None]
        cells = [system, str(len(seeds)) if seeds else "—"]
        cells += [f"{scale * mean[m].mean():.{digits}f}" for m in metrics]
        per_seed = [scale * s[primary].mean() for _, s in runs]
        cells.append(f"{np.std(per_seed, ddof=1):.{digits}f}" if len(per_seed) > 1 else "—")
        if reference is not None:
            if system == reference:
                cells.append("—")
            else:
                if mean[primary].shape != ref[primary].shape:
                    raise ValueError(f"{system}: {mean[primary].size} items vs "
                                     f"{ref[primary].size} for {reference}; not paired")
                cells.append(format_interval(
                    paired_bootstrap(mean[primary], ref[primary], num_samples=num_samples),
                    scale=scale, digits=digits))
        if paper:
            value = paper.get(system, {}).get(primary)
            cells.append("—" if value is None else f"{value:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def provenance(specs: Sequence[RunSpec], root) -> str:
    """A Markdown section listing each finished cell's commit, finish time and wall time
    (from its ``cell.json``; cells finished before the grid recorded them say so), and each
    cell not finished yet as such."""
    root = storage.as_path(root)
    lines = ["## Cells", "", "| cell | commit | finished | wall |", "|---|---|---|---|"]
    notes: list[str] = []
    for spec in specs:
        workdir = root / spec.key
        if not (workdir / SCORES_FILE).exists():
            lines.append(f"| {spec.key} | not finished yet (re-running the command runs it) "
                         "| — | — |")
            continue
        try:
            cell = json.loads((workdir / CELL_FILE).read_text())
            mark = ""
            if cell.get("source"):  # filled in by hand for a cell older than cell.json
                if cell["source"] not in notes:
                    notes.append(cell["source"])
                mark = "*" * (notes.index(cell["source"]) + 1)
            lines.append(f"| {spec.key} | `{cell['commit']}`{mark} | {cell['finished']} | "
                         f"{cell['seconds'] / 60:.1f} min |")
        except (OSError, ValueError, KeyError):
            lines.append(f"| {spec.key} | not recorded | — | — |")
    lines += [""] + [f"{'*' * (i + 1)} {n}" for i, n in enumerate(notes)] if notes else []
    return "\n".join(lines)


def _compact(values: np.ndarray) -> np.ndarray:
    """float32 when that loses nothing (0/1 hits, float32 cosines), else as given."""
    small = values.astype(np.float32)
    return small if np.array_equal(small, values) else values


def write_results(paper: str, text: str,
                  grid: Mapping[str, Sequence[tuple[int | None, Scores]]],
                  results_dir=RESULTS_DIR, *, specs: Sequence[RunSpec] = (),
                  root=None) -> Path:
    """Writes ``<results_dir>/<paper>.md`` (``text``) and ``<paper>.npz`` (every finished
    run's per-item scores, keys ``"<system>|seed=<seed>|<metric>"``), each atomically.
    With ``specs`` and ``root`` (the grid's), the Markdown ends with :func:`provenance`.

    Returns:
      The Markdown file's path.
    """
    results_dir = storage.as_path(results_dir)
    arrays = {f"{system}|seed={seed}|{metric}": _compact(values)
              for system, runs in grid.items() for seed, scores in runs
              for metric, values in scores.items()}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # 0/1 hits compress ~20x (they are committed)
    md = results_dir / f"{paper}.md"
    if specs and root is not None:
        text = text.rstrip() + "\n\n" + provenance(specs, root)
    # The pair must not go out of step: a results folder that refuses the Markdown (a
    # folder in its place, no permission) is found before the .npz is replaced.
    if md.is_dir() or (results_dir / f"{paper}.npz").is_dir():
        raise IsADirectoryError(f"{storage.display(md)} or its .npz is a folder; not written")
    write_text_atomic(md.with_name(f".{paper}.md.check"), "")
    md.with_name(f".{paper}.md.check").unlink()
    write_bytes_atomic(results_dir / f"{paper}.npz", buf.getvalue())
    write_text_atomic(md, text.rstrip() + "\n")
    print(f"wrote {storage.display(md)} and {paper}.npz")
    return Path(str(md))


MINILM_NOTE = (
    "**Starting checkpoint.** Every trained row starts from all-MiniLM-L6-v2, the only "
    "checkpoint available offline, which was itself trained on NLI and SQuAD pairs (among "
    "~1B sentence pairs): the off-the-shelf row is a strong, partly in-domain baseline, not "
    "an untrained model.")
