"""DualCSE learning curves: SimCSE(INLI) against DualCSE-Cross (and Bi, Cross w/o
intra-sentence) at several points of one run, scored with thresholds and without.

Each curve is one run per seed on a fixed schedule (its ``num_train_steps``: the learning
rate decays to 0 at the schedule's end), stopped at each evaluation step with a checkpoint,
scored there (``dualcse_cells.scores_of(..., raw=True)``: per-pair correctness for every
score rule and the raw cosines), then resumed. A cell resumes from its last checkpoint and
skips the stages already scored (``<workdir>/curve/step<N>.npz``).

Threshold-free measures (``auc_table``), per class, from the raw test cosines under the
rules with one score (``max``, ``explicit``, ``implicit``; ``pair`` has two thresholds and no
single score): an entailed class (explicit, implied) against every not-entailed pair; a
not-entailed class (neutral, contradiction) as negatives against every entailed pair;
``all``: entailed against not entailed. ROC-AUC and average precision
(``embedding_core.evaluation.metrics``), intervals by class-stratified paired bootstrap
(``embedding_core.evaluation.stats.paired_bootstrap_statistic``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dualcse_jax.evaluate import ENTAILED, class_items, one_score  # noqa: F401 (re-exported)
from experiments import grid
from experiments.dualcse_cells import (
    CLASSES,
    CPU_STEPS,
    RULES,
    SIMCSE,
    SYSTEMS,
    rte_sets,
    run_config,
    save_thresholds,
    scores_of,
)

EPOCH_STEPS = 500
"""One epoch of INLI train (8,000 premises) at 16 premises per step."""
ONE_SCORE_RULES = ("max", "explicit", "implicit")


@dataclasses.dataclass(frozen=True)
class Curve:
    """One curve: system ``key`` (``SYSTEMS``) trained on a ``schedule``-step schedule with
    ``premises`` per step, scored at steps ``at``, for each of ``seeds``."""

    key: str
    schedule: int
    at: tuple[int, ...]
    seeds: tuple[int, ...] = (0,)
    premises: int = 16
    learning_rate: float | None = None  # None: the preset's (cross_cpu.py: 1e-4)

    @property
    def setting(self) -> str:
        """The schedule and batch, shared by the curves a row is compared with."""
        name = f"{self.schedule}-step schedule"
        if self.premises != 16:
            name += f", {self.premises} premises/step, lr {self.learning_rate:g}"
        return name

    @property
    def row(self) -> str:
        return f"{SYSTEMS[self.key][0]}, {self.setting}"

    def cell(self, seed: int) -> str:
        return f"curve-{self.key}-sched{self.schedule}-b{self.premises}-seed{seed}"


CURVES = (
    Curve("simcse", EPOCH_STEPS, (100, 250, 500), (0, 1, 2)),
    Curve("cross", EPOCH_STEPS, (100, 250, 500), (0, 1, 2)),
    Curve("bi", EPOCH_STEPS, (100, 250, 500)),
    Curve("cross-nointra", EPOCH_STEPS, (100, 250, 500)),
    Curve("simcse", 2 * EPOCH_STEPS, (250, 500, 1000)),
    Curve("cross", 2 * EPOCH_STEPS, (250, 500, 1000)),
    # The paper's batch: 64 premises, lr 5e-5; one epoch is 125 steps.
    Curve("simcse", 125, (125,), premises=64, learning_rate=5e-5),
    Curve("cross", 125, (125,), premises=64, learning_rate=5e-5),
)
CURVE_BASELINE = "curve-baseline-minilm"
CURVE_BASELINE_ROW = "MiniLM off the shelf (step 0 of every curve)"


def curve_config(curve: Curve, seed: int):
    """``run_config``'s CPU preset on the curve's schedule, batch and learning rate."""
    c = run_config(curve.key, "cpu", seed)
    c.num_train_steps = curve.schedule
    c.checkpoint_every = 50
    c.keep_checkpoints = 2  # the stage just reached is the latest, whatever came before
    if curve.premises != 16:
        c.batch_size = curve.premises * (2 if curve.key == "simcse" else 1)
    if curve.learning_rate is not None:
        c.learning_rate = curve.learning_rate
    return c


def saved_step(workdir: Path) -> int:
    """The latest checkpoint's step in ``workdir`` (0: none)."""
    folder = Path(workdir) / "checkpoints"
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
    return max(steps, default=0)


def curve_run(curve: Curve, seed: int):
    def run(workdir: Path) -> grid.Scores:
        from dualcse_jax.inference import load
        from dualcse_jax.trainer import train

        config = curve_config(curve, seed)
        val, test = rte_sets()
        out: grid.Scores = {}
        for step in curve.at:
            stage = workdir / "curve" / f"step{step}.npz"
            if not stage.exists():
                done = saved_step(workdir)
                if done < step:
                    train(config, workdir, stop_after=step - done)
                scores, thresholds = scores_of(load(workdir, step=step), val, test, raw=True)
                save_thresholds(workdir / "curve" / f"step{step}", thresholds)
                grid.save_scores(stage, scores)
                print(f"{curve.cell(seed)}: step {step} scored", flush=True)
            out.update({f"step{step}/{k}": v for k, v in grid.load_scores(stage).items()})
        return out
    return run


def curve_specs() -> list[grid.RunSpec]:
    """The baseline, then seed 0 of every curve before any seed 1 (the first finished cells
    make a full table), in :data:`CURVES` order within a seed."""
    from experiments.dualcse_cells import baseline

    specs = [grid.RunSpec(CURVE_BASELINE_ROW, CURVE_BASELINE, baseline("cpu", raw=True))]
    for seed in (0, 1, 2):
        specs += [grid.RunSpec(c.row, c.cell(seed), curve_run(c, seed), seed=seed)
                  for c in CURVES if seed in c.seeds]
    return specs


def _steps(scores: grid.Scores) -> list[int]:
    return sorted({int(k.split("/")[0][4:]) for k in scores if k.startswith("step")})


def _at(runs, step: int | None) -> list[tuple[int | None, grid.Scores]]:
    """The runs' scores at ``step`` under plain keys (the baseline has no step)."""
    if step is None:
        return list(runs)
    prefix = f"step{step}/"
    return [(seed, {k[len(prefix):]: v for k, v in s.items() if k.startswith(prefix)})
            for seed, s in runs]


def _reference(row: str) -> str:
    """SimCSE's row on the same schedule and batch as ``row``."""
    return SIMCSE + row[row.index(","):] if "," in row else SIMCSE


def accuracy_table(results: Mapping, rule: str, num_samples: int) -> str:
    """Rows x steps: mean RTE average accuracy (%) over seeds, its sd, and the paired
    interval against SimCSE(INLI) on the same schedule at the same step."""
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap

    steps = [0] + sorted({s for runs in results.values() for s in _steps(runs[0][1])})
    head = ["row", "seeds", *(f"step {s}" for s in steps)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, runs in results.items():
        cells = [row, str(len(runs)) if row != CURVE_BASELINE_ROW else "—"]
        for step in steps:
            if row == CURVE_BASELINE_ROW:  # the starting point of every curve
                cells.append(f"{100 * grid.seed_mean(runs)[f'{rule}/average'].mean():.2f}"
                             if step == 0 else "")
                continue
            if step not in _steps(runs[0][1]):
                cells.append("")
                continue
            at = _at(runs, step)
            mean = grid.seed_mean(at)[f"{rule}/average"]
            per_seed = [100 * s[f"{rule}/average"].mean() for _, s in at]
            text = f"{100 * mean.mean():.2f}"
            if len(per_seed) > 1:
                text += f" (sd {np.std(per_seed, ddof=1):.2f})"
            ref = results.get(_reference(row))
            if ref and row != _reference(row) and step in _steps(ref[0][1]):
                iv = paired_bootstrap(mean, grid.seed_mean(_at(ref, step))[f"{rule}/average"],
                                      num_samples=num_samples)
                text += f"; Δ {format_interval(iv)}"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seed_scores(runs, cls: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    cols, labels = [], None
    for _, s in runs:
        sims = {c: s[f"sims/test/{c}"] for c in CLASSES}
        x, labels = class_items(sims, cls, rule)
        cols.append(x)
    return np.stack(cols, axis=1), labels


AUC_NOTE = """Per class: an entailed class (explicit, implied) against every not-entailed pair; a
not-entailed class (neutral, contradiction) as the negatives against every entailed pair;
`all`: entailed against not entailed. Values are means over seeds; intervals resample
test pairs within each label (class-stratified), paired across systems and seeds. The
`pair` rule has two thresholds and no single score, so it has no AUC.
"""


def auc_table(results: Mapping, rule: str, num_samples: int) -> str:
    """Per (row, step): ROC-AUC per class and over all pairs, AP of implied and of all,
    and the intervals of implied and all AUC against SimCSE at the same step. A row
    without steps (the baseline, the 200-step grid's rows) is one line, step "—"; rows
    without raw cosines are left out."""
    from embedding_core.evaluation import metrics
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap_statistic

    classes = (*CLASSES, "all")
    head = ["row", "step", *(f"AUC {c}" for c in classes), "AP implied", "AP all",
            "AUC implied − SimCSE [95% CI]", "AUC all − SimCSE [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, runs in results.items():
        for step in _steps(runs[0][1]) or [None]:  # None: scored once, at the run's end
            at = _at(runs, step)
            if "sims/test/implied" not in at[0][1]:
                continue
            cells = [row, "—" if step is None else str(step)]
            for measure, names in ((metrics.roc_auc_rows, classes),
                                   (metrics.average_precision_rows, ("implied", "all"))):
                for c in names:
                    x, y = _seed_scores(at, c, rule)  # [n, seeds]: mean of seed values
                    cells.append(f"{100 * measure(x.T, np.broadcast_to(y, x.T.shape)).mean():.2f}")
            ref = results.get(_reference(row))
            for c in ("implied", "all"):
                if (not ref or row == _reference(row)
                        or step not in (_steps(ref[0][1]) or [None])
                        or "sims/test/implied" not in _at(ref, step)[0][1]):
                    cells.append("—")
                    continue
                (x, y), (xr, _) = _seed_scores(at, c, rule), _seed_scores(_at(ref, step), c, rule)
                iv = paired_bootstrap_statistic(metrics.roc_auc_rows, x, xr, y,
                                                num_samples=num_samples)
                cells.append(format_interval(iv))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gap(results: Mapping, row: str, step: int, rule: str, num_samples: int, auc: bool):
    from embedding_core.evaluation import metrics
    from embedding_core.evaluation.stats import paired_bootstrap, paired_bootstrap_statistic

    a, b = _at(results[row], step), _at(results[_reference(row)], step)
    if auc:
        (x, y), (xr, _) = _seed_scores(a, "all", rule), _seed_scores(b, "all", rule)
        return paired_bootstrap_statistic(metrics.roc_auc_rows, x, xr, y,
                                          num_samples=num_samples)
    return paired_bootstrap(grid.seed_mean(a)[f"{rule}/average"],
                            grid.seed_mean(b)[f"{rule}/average"], num_samples=num_samples)


def _sign(iv) -> str:
    if iv.high < 0:
        return "SimCSE ahead"
    return "Cross ahead (the paper's sign)" if iv.low > 0 else "not resolved"


def _cross_curves(results: Mapping, keys: Sequence[str] = ("cross",)):
    """``(curve, row, SimCSE's row, steps scored in both)`` of each finished curve of the
    systems ``keys``."""
    for curve in (c for c in CURVES if c.key in keys):
        row, ref = curve.row, _reference(curve.row)
        if row in results and ref in results:
            yield curve, row, ref, [s for s in _steps(results[row][0][1])
                                    if s in _steps(results[ref][0][1])]


def _where(ivs: Mapping) -> str:
    """Signs of named intervals in words: ``"SimCSE ahead under explicit, AUC max; not
    resolved under max"``, or one sign under every rule and both AUCs."""
    by: dict[str, list[str]] = {}
    for name, iv in ivs.items():
        by.setdefault(_sign(iv), []).append(name)
    if len(by) == 1:
        return f"under every rule and both AUCs: {next(iter(by))}"
    return "; ".join(f"{sign} under {', '.join(names)}" for sign, names in by.items())


def _final_gaps(results: Mapping, row: str, step: int, num_samples: int) -> dict:
    ivs = {rule: _gap(results, row, step, rule, num_samples, False) for rule in RULES}
    ivs.update({f"AUC {r}": _gap(results, row, step, r, num_samples, True)
                for r in ("max", "implicit")})
    return ivs


def verdict(results: Mapping, num_samples: int) -> str:
    """The budget explanation tested: DualCSE-Cross − SimCSE(INLI) at each scored step of
    each schedule, under every rule (average accuracy) and threshold-free (AUC of all pairs,
    ``max`` and ``implicit`` scores), with the resulting signs in words."""
    from embedding_core.evaluation.stats import format_interval

    lines = []
    for _, row, ref, steps in _cross_curves(results):
        lines.append(f"- **{row}** ({len(results[row])} seed(s); SimCSE "
                     f"{len(results[ref])}):")
        for step in steps:
            gaps = {rule: _gap(results, row, step, rule, num_samples, False) for rule in RULES}
            parts = [f"{rule} {format_interval(iv)}" for rule, iv in gaps.items()]
            aucs = [_gap(results, row, step, rule, num_samples, True)
                    for rule in ("max", "implicit")]
            signs = {_sign(iv) for iv in (*gaps.values(), *aucs)}
            agree = (f"every rule and both AUCs: {next(iter(signs))}" if len(signs) == 1 else
                     "the rules disagree: " + "; ".join(sorted(signs)))
            lines.append(f"  - step {step}: average accuracy Δ " + ", ".join(parts)
                         + f"; AUC(all) Δ max {format_interval(aucs[0])}, implicit "
                         f"{format_interval(aucs[1])} → {agree}.")
    if not lines:
        return ""
    return ("### Does more training close the gap? (Cross − SimCSE, same schedule)\n\n"
            + "\n".join(lines) + "\n")


def budget_paragraph(results: Mapping, num_samples: int) -> str:
    """The verdict on the budget explanation ("more steps close DualCSE-Cross's gap to
    SimCSE(INLI)"), worded from the numbers of the cells finished so far: per schedule and
    dual system (Cross, then Bi and Cross w/o intra-sentence), its gap to SimCSE at the
    first and last scored step (RTE average under ``max``, AUC of all pairs under the
    ``max`` score), how far it moved and toward whom, its sign at the last step under every rule and
    both AUCs (``max``, ``implicit``); then whether Cross's gap narrowed on every schedule
    and closed on the longest. ``""`` without a Cross curve."""
    from embedding_core.evaluation.stats import format_interval

    sentences, moves, longest = [], [], None
    for curve, row, ref, steps in _cross_curves(results, ("cross", "bi", "cross-nointra")):
        if not steps:
            continue
        name = SYSTEMS[curve.key][0]
        first, last = steps[0], steps[-1]
        acc = [_gap(results, row, s, "max", num_samples, False) for s in (first, last)]
        auc = [_gap(results, row, s, "max", num_samples, True) for s in (first, last)]
        where = _where(_final_gaps(results, row, last, num_samples))
        batch = f"{curve.premises} premises per step"
        if curve.learning_rate is not None:
            batch += f", lr {curve.learning_rate:g}"
        setting = (f"On the {curve.schedule}-step schedule ({batch}; {name} "
                   f"{len(results[row])} seed(s), SimCSE {len(results[ref])}), ")
        if first == last:  # one scored step: a level, not a trend
            sentences.append(
                setting + f"{name} − SimCSE at step {last} is {format_interval(acc[1])} on "
                f"the RTE average (`max`) and {format_interval(auc[1])} in AUC(all); "
                f"{where}.")
            continue
        moved = acc[1].mean_difference - acc[0].mean_difference
        trend = f"{100 * moved:+.2f} points, toward {name if moved > 0 else 'SimCSE'}"
        if curve.key == "cross":
            moves.append(moved)
            if longest is None or curve.schedule > longest[0]:
                longest = (curve.schedule, last, where)
        sentences.append(
            setting + f"{name} − SimCSE on the RTE average "
            f"(`max`) went from {format_interval(acc[0])} at step {first} to "
            f"{format_interval(acc[1])} at step {last} ({trend}), and AUC(all) from "
            f"{format_interval(auc[0])} to {format_interval(auc[1])}; at step {last} "
            f"{where}.")
    if not moves and not sentences:
        return ""
    if longest is not None:
        schedule, last, where = longest
        closed = "SimCSE ahead" not in where
        sentences.append(
            ("So more training narrows Cross's gap on every schedule scored at more than "
             "one step" if all(m > 0 for m in moves) else
             "So more training does not narrow Cross's gap on every schedule")
            + (", and closes it" if closed else ", but does not close it")
            + f" by step {last} of the {schedule}-step schedule ({where}).")
    missing = [c.cell(s) for c in CURVES for s in c.seeds
               if c.row not in results or s not in {sd for sd, _ in results[c.row]}]
    return ("### Verdict on the budget explanation\n\n" + " ".join(sentences)
            + " Intervals cover the test pairs, not the seeds; a curve with one seed is one "
            "run." + (f" Cells not yet run: {', '.join(missing)}." if missing else "")
            + "\n")


def section(results: Mapping, num_samples: int) -> str:
    """The learning-curve part of ``dualcse.md``: tables under every rule, threshold-free
    tables and the gap of Cross to SimCSE by step, as numbers."""
    if not results:
        return ""
    parts = [f"""## Learning curves (one run per seed, scored at several steps)

Every curve row is one run per seed on the schedule its name gives (the learning rate
decays linearly to 0 at the schedule's last step, after {curve_config(CURVES[0], 0).warmup_steps}
warm-up steps); a column is that run's checkpoint at that step, not a run trained for that
many steps. {EPOCH_STEPS} steps of 16 premises are one epoch of INLI train; the 200-step
grid above uses its own 200-step schedule (preset `cross_cpu.py`, {CPU_STEPS} steps). The raw
test and val cosines of every scored checkpoint are in `dualcse.npz`
(`"<row>|seed=<s>|step<N>/sims/<val|test>/<class>"`, columns cos(r_p, r_h), cos(u_p, r_h)).
Δ: paired-bootstrap interval of the average against SimCSE(INLI) on the same schedule at the
same step (test pairs resampled; seeds averaged first).
"""]
    for rule in RULES:
        parts.append(f"### RTE average accuracy (%), rule `{rule}`\n")
        parts.append(accuracy_table(results, rule, num_samples) + "\n")
    parts.append(f"### Threshold-free: ROC-AUC and average precision (%) per class\n\n{AUC_NOTE}")
    for rule in ONE_SCORE_RULES:
        parts.append(f"#### Score `{rule}`\n")
        parts.append(auc_table(results, rule, num_samples) + "\n")
    parts.append(verdict(results, num_samples))
    parts.append(budget_paragraph(results, num_samples))
    return "\n".join(parts)


def run_curves(root: Path, *, only: Sequence[str] = (), table_only: bool = False) -> dict:
    """Runs (or skips) every curve cell under ``root``; the finished ones by row."""
    return grid.run_grid(curve_specs(), root, only=only, table_only=table_only)
