"""The paper's signs (``dualcse_cells.COMPARISONS``) at every budget trained here, under every
RTE score rule and without a threshold: which hold, which reverse, which the intervals leave
open.

A budget is the 200-step grid or one scored step of a learning curve
(``dualcse_curves.CURVES``). Per comparison and budget: the paired-bootstrap interval of the
accuracy difference under each rule (the compared metric: the RTE average or implied
accuracy) and, where both systems' cells kept the raw cosines, of the ROC-AUC difference under
each one-score rule (``all`` pairs for the average, the implied class for implied). A
measure's sign is :func:`experiments.grid.sign_verdict` against the paper's difference.
"""

from __future__ import annotations

from collections.abc import Mapping

from experiments import dualcse_curves as dc
from experiments import grid
from experiments.dualcse_cells import COMPARISONS, CPU_STEPS, PAPER, RULES, SYSTEMS

_AUC_CLASS = {"average": "all", "implied": "implied"}


def budgets(grid_results: Mapping, curve_results: Mapping) -> list[tuple[str, dict]]:
    """``(label, {system: runs})`` for the grid and each scored step of each curve schedule,
    the runs' scores under plain keys (``"<rule>/<class>"``, ``"sims/test/<class>"``)."""
    out = []
    trained = {s: runs for s, runs in grid_results.items() if s in PAPER}
    if trained:
        out.append((f"{CPU_STEPS}-step grid", trained))
    for setting in dict.fromkeys(c.setting for c in dc.CURVES):  # in CURVES order
        rows = {SYSTEMS[c.key][0]: curve_results[c.row] for c in dc.CURVES
                if c.setting == setting and c.row in curve_results}
        for step in sorted({s for runs in rows.values() for s in dc._steps(runs[0][1])}):
            at = {s: dc._at(runs, step) for s, runs in rows.items()
                  if step in dc._steps(runs[0][1])}
            out.append((f"{setting}, step {step}", at))
    return out


def _measures(runs, ref, metric: str, num_samples: int) -> dict:
    """``{measure name: interval}``: accuracy under every rule, AUC under one-score rules."""
    from embedding_core.evaluation import metrics
    from embedding_core.evaluation.stats import paired_bootstrap, paired_bootstrap_statistic

    a, b = grid.seed_mean(runs), grid.seed_mean(ref)
    out = {rule: paired_bootstrap(a[f"{rule}/{metric}"], b[f"{rule}/{metric}"],
                                  num_samples=num_samples) for rule in RULES}
    if "sims/test/implied" in runs[0][1] and "sims/test/implied" in ref[0][1]:
        for rule in dc.ONE_SCORE_RULES:
            (x, y), (xr, _) = (dc._seed_scores(runs, _AUC_CLASS[metric], rule),
                               dc._seed_scores(ref, _AUC_CLASS[metric], rule))
            out[f"AUC {rule}"] = paired_bootstrap_statistic(metrics.roc_auc_rows, x, xr, y,
                                                            num_samples=num_samples)
    return out


def summary(signs: Mapping[str, str]) -> str:
    """The signs of one comparison in words: ``"holds under every measure"``, or which
    measures hold, reverse and leave it open."""
    kinds = {"holds": [], "reversed": [], "open": []}
    for name, sign in signs.items():
        kinds[sign if sign in kinds else "open"].append(name)
    for kind, names in kinds.items():
        if len(names) == len(signs):
            return f"{'open' if kind == 'open' else kind} under every measure"
    return "; ".join(f"{kind} under {', '.join(names)}" for kind, names in kinds.items()
                     if names)


def claims_table(grid_results: Mapping, curve_results: Mapping, num_samples: int) -> str:
    """One row per (comparison, budget) with both systems trained: intervals per measure
    (percentage points) and the signs in words; ``""`` when no comparison can be made."""
    from embedding_core.evaluation.stats import format_interval

    measures = [*RULES, *(f"AUC {r}" for r in dc.ONE_SCORE_RULES)]
    head = ["comparison (paper Δ)", "budget", "seeds", *measures, "against the paper's sign"]
    lines = []
    for label, systems in budgets(grid_results, curve_results):
        for system, ref, metric in COMPARISONS:
            if system not in systems or ref not in systems:
                continue
            col = ("explicit", "implied", "neutral", "contradiction", "average").index(metric)
            paper = PAPER[system][col] - PAPER[ref][col]
            ivs = _measures(systems[system], systems[ref], metric, num_samples)
            signs = {m: grid.sign_verdict(iv, paper) for m, iv in ivs.items()}
            cells = [f"{system} − {ref}, {metric} ({paper:+.2f})", label,
                     f"{len(systems[system])}/{len(systems[ref])}",
                     *(format_interval(ivs[m]) if m in ivs else "—" for m in measures),
                     summary(signs)]
            lines.append("| " + " | ".join(cells) + " |")
    if not lines:
        return ""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines])


def section(grid_results: Mapping, curve_results: Mapping, num_samples: int) -> str:
    """The "Claims" part of ``dualcse.md``: the table and how to read it."""
    table = claims_table(grid_results, curve_results, num_samples)
    if not table:
        return ""
    return f"""## Claims: the paper's signs by budget, rule and threshold-free measure

Each row compares two systems trained on the same budget (the 200-step grid, or one scored
step of a learning curve; the curves' learning rate follows their own schedule, so step 250
of the 500-step schedule is not a 250-step run). Columns: difference in percentage points
with its paired-bootstrap 95% interval, RTE accuracy of the compared metric under each
score rule, then ROC-AUC (`all` pairs for the average, the implied class for implied; "—"
where a cell kept no raw cosines). "holds": the interval excludes 0 on
the paper's side; "reversed": on the other; "open": it covers 0. Seeds: system/reference;
intervals cover test pairs, not seeds. A claim stated elsewhere in this file or the README
holds only where this table says so.

{table}
"""
