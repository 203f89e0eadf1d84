"""DualCSE: RTE on INLI test for SimCSE(INLI), DualCSE-Cross/Bi and two ablations, with
intervals, under every RTE score rule.

The paper's comparison (docs/dualcse.md): DualCSE-Cross and DualCSE-Bi against supervised
SimCSE trained on the same INLI data, as RTE accuracy per hypothesis class and their
average. Rows here:

- all-MiniLM-L6-v2 off the shelf (mean pooling, one vector: r = u), itself NLI-trained;
- SimCSE(INLI): two rows per premise (explicit and implied entailment as positives, the
  contradiction as hard negative), siblings masked (``dualcse_jax.loss.simcse_loss``);
- DualCSE-Cross and DualCSE-Bi (the 5-term loss);
- DualCSE-Cross without contradictions (``use_contradiction=False``) and without the
  intra-sentence terms (``use_intra=False``).

Every trained row starts from MiniLM with mean pooling, the same optimiser (AdamW, linear
decay), learning rate, dropout, maximum length and step count, and sees the same premises
per step (SimCSE's batch holds two rows per premise). Each trained run is scored once;
its per-pair 0/1 correctness on the 4,000 INLI test pairs is kept for each RTE score rule
(``config.eval_rte_score_rule``: max, explicit, implicit, pair; thresholds tuned on INLI
val), and the primary metric is the macro average of the four classes
(``grid.macro_average_items``). The EIS column is the INLI PROXY (premise vs its implied
entailment; ImpScore's data is not shipped).

Run from the repository root; re-running the same command skips finished runs::

  python -m experiments.dualcse --preset=cpu

``--preset=cpu``: ``dualcse_jax/configs/cross_cpu.py`` (batch 16 premises, lr 1e-4,
max length 64, hash dropout) for CPU_STEPS (200, the preset's own) steps per run;
SimCSE, Cross, Bi and Cross without contradictions (the first four trained rows) with
three seeds, Cross without intra-sentence terms with one; about two and a half hours on 2
quiet cores, resumable across sessions (finished cells are skipped, a stopped cell
resumes from its last checkpoint); then the learning curves (``experiments/dualcse_curves.py``,
cells ``curve-*``; about six hours more; ``--only curve`` runs only them). Cells that the
committed ``experiments/results/dualcse.npz`` holds are restored, not re-run.
``--preset=gpu``: the paper's batch sizes and learning rates (Cross 64 / 5e-5, Bi 32 /
3e-5, SimCSE 64 premises = 128 rows / 5e-5), one full epoch of INLI train, max length
128, three seeds for every trained row, still MiniLM (no BERT/RoBERTa-base offline).
``--steps=N`` overrides the step count (its default root and the header say so).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

import numpy as np

from experiments import dualcse_claims, dualcse_curves, grid
from experiments.dualcse_cells import (  # noqa: F401 (SEEDS, run_config: the grid's API)
    ABLATIONS,
    BASELINE,
    BI,
    CLASSES,
    COLUMNS,
    COMPARISONS,
    CPU_STEPS,
    CROSS,
    MAIN,
    NO_CONTRA,
    NO_INTRA,
    PAPER,
    RULES,
    SEEDS,
    SIMCSE,
    SYSTEMS,
    THREE_SEEDS,
    baseline,
    run_config,
    scores_of,
    train_and_score,
)


def seeds_of(key: str, preset: str) -> Sequence[int]:
    return SEEDS if key in THREE_SEEDS or preset == "gpu" else SEEDS[:1]


def grid_specs(preset: str, steps: int | None = None) -> list[grid.RunSpec]:
    specs = [grid.RunSpec(BASELINE, "baseline-minilm", baseline(preset, raw=True))]
    for key in (*MAIN, *ABLATIONS):
        for seed in seeds_of(key, preset):
            specs.append(grid.RunSpec(SYSTEMS[key][0], f"{key}-seed{seed}",
                                      train_and_score(key, preset, seed, steps), seed=seed))
    return specs


def sibling_meetings(num_premises: int, batch_rows: int, seed: int, steps: int
                     ) -> tuple[int, int]:
    """How often SimCSE(INLI)'s two rows of one premise (table rows 2i, 2i+1) share a
    global batch over ``steps`` steps, in the pipeline's order (``data_pipelines.pipeline``:
    epoch e visits ``default_rng([seed, e]).permutation(n)``, remainder dropped).

    Returns:
      ``(steps with at least one sibling pair, sibling pairs in all)``.
    """
    n = 2 * num_premises
    per_epoch = n // batch_rows
    batches, pairs = 0, 0
    perm, epoch = None, -1
    for step in range(steps):
        e, b = divmod(step, per_epoch)
        if e != epoch:
            perm, epoch = np.random.default_rng([seed, e]).permutation(n), e
        premise = perm[b * batch_rows:(b + 1) * batch_rows] // 2
        k = batch_rows - len(np.unique(premise))
        batches += k > 0
        pairs += k
    return batches, pairs


def _view(results: Mapping, rule: str, systems: Sequence[str]) -> dict:
    """The grid restricted to ``systems``, with one rule's metrics under plain names."""
    return {s: [(seed, {c: sc[f"{rule}/{c}"] for c in COLUMNS}) for seed, sc in results[s]]
            for s in systems if s in results}


def comparisons(results: Mapping, rule: str, num_samples: int) -> str:
    """The paper's signs against ours: one line per comparison with the paired interval."""
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap

    lines = ["| comparison | paper | here [95% CI] | sign |", "|---|---|---|---|"]
    for system, ref, metric in COMPARISONS:
        if system not in results or ref not in results:
            continue
        col = COLUMNS.index(metric)
        paper = PAPER[system][col] - PAPER[ref][col]
        a = grid.seed_mean(results[system])[f"{rule}/{metric}"]
        b = grid.seed_mean(results[ref])[f"{rule}/{metric}"]
        iv = paired_bootstrap(a, b, num_samples=num_samples)
        verdict = grid.sign_verdict(iv, paper)
        lines.append(f"| {system} − {ref}, {metric} | {paper:+.2f} | "
                     f"{format_interval(iv)} | {verdict} |")
    return "\n".join(lines)


def _paper_table() -> str:
    lines = ["| model (paper, BERT/RoBERTa-base) | " + " | ".join(COLUMNS) + " |",
             "|" + "---|" * (len(COLUMNS) + 1)]
    lines += [f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |"
              for name, values in PAPER.items()]
    return "\n".join(lines)


def setting(preset: str, steps: int | None) -> str:
    """The training budget in words, from the configs themselves."""
    cross = run_config("cross", preset, 0, steps)
    simcse = run_config("simcse", preset, 0, steps)
    bi = run_config("bi", preset, 0, steps)
    if preset == "cpu":
        budget = (f"{cross.num_train_steps} steps of {cross.batch_size} premises for every "
                  f"trained row ({cross.num_train_steps * cross.batch_size:,} of INLI train's "
                  f"8,000 premises; SimCSE's batch is {simcse.batch_size} rows, two per "
                  f"premise), lr {cross.learning_rate:g} with {cross.warmup_steps} warm-up "
                  "steps and linear decay")
    else:
        budget = (f"one epoch of INLI train for every trained row (8,000 premises): Cross "
                  f"and its ablations batch {cross.batch_size} / lr {cross.learning_rate:g}, "
                  f"Bi {bi.batch_size} / {bi.learning_rate:g}, SimCSE {simcse.batch_size} rows "
                  f"({simcse.batch_size // 2} premises) / {simcse.learning_rate:g}")
    return (f"{budget}; AdamW, pooling {cross.pooling}, max length {cross.max_length}, "
            f"dropout {'on' if cross.dropout else 'off'} ({cross.dropout_impl}), "
            f"τ {cross.temperature}")


def _budget_note(preset: str) -> str:
    if preset == "cpu":
        return ("a fraction of one epoch; every trained row has the same optimiser, learning "
                "rate, pooling and premises per step (the paper trains Cross with batch 64 / "
                "lr 5e-5 and Bi with 32 / 3e-5, as --preset=gpu does)")
    return ("one epoch (the paper's epoch count is not in our sources), the paper's batch "
            "sizes and learning rates; SimCSE(INLI) at Cross's 64 premises / 5e-5 (not in "
            "our sources)")


def report(results: Mapping, args, claims: str = "") -> str:
    order = [BASELINE] + [SYSTEMS[k][0] for k in (*MAIN, *ABLATIONS)]
    present = [s for s in order if s in results]
    seeds = {s: len(results[s]) for s in present if s != BASELINE}
    sib = run_config("simcse", args.preset, 0, args.steps)
    sib_steps = int(sib.num_train_steps) or 16_000 // int(sib.batch_size)  # 0: one epoch
    meet = [sibling_meetings(8000, int(sib.batch_size), s, sib_steps)
            for s in seeds_of("simcse", args.preset)]
    steps_note = (f"\n\n**`--steps={args.steps}` overrides the preset's step count "
                  f"({CPU_STEPS if args.preset == 'cpu' else 'one epoch'}); a few steps make "
                  "a smoke test, not a result.**" if args.steps else "")
    parts = [f"""# DualCSE: RTE on INLI test, per score rule, with intervals

Produced by `{grid.command_line()}` on {datetime.date.today()} at commit `{grid.commit()}`
(preset `{args.preset}`; raw per-pair scores in `dualcse.npz`, keys
`"<system>|seed=<seed>|<rule>/<class>"`, `"…|<rule>/average"`, `"…|eis_proxy"` and the
raw cosines `"…|sims/<val|test>/<class>"`, columns cos(r_p, r_h), cos(u_p, r_h)).
Re-running the command skips finished runs.{steps_note}

{grid.MINILM_NOTE}

**Setting.** {setting(args.preset, args.steps)}. Trained rows: mean over seeds
{seeds}. RTE: 4,000 INLI test pairs (1,000 per class), each pair 0/1 correct; "average"
is the macro average of the four classes (equal class sizes, so it is the accuracy over
all pairs). Thresholds tuned on the 4,000 INLI val pairs. Intervals: paired bootstrap
({args.num_samples:,} resamples of the test pairs) of the seed-averaged per-pair scores;
they cover the choice of test pairs, not of seeds (the sd column). One test row (571)
gives one sentence as implied entailment and contradiction, so one of its two pairs is
wrong for every model (docs/dualcse.md).

**Departures from the paper.**
1. all-MiniLM-L6-v2 (6 layers, 384 wide, NLI/SQuAD-trained), not BERT/RoBERTa-base.
2. Budget: {_budget_note(args.preset)}.
3. Pooling: mean over tokens (MiniLM's own; the paper does not say).
4. The RTE decision rule is not in our sources: every rule is reported below; the paper's
   numbers belong to an unknown one.
5. SimCSE(INLI) masks the sibling row's entailment (the other positive of the same premise)
   out of the denominator; measured sibling meetings over the run's steps, per seed
   (steps with a pair, pairs): {meet}.
6. EIS: INLI proxy (premise vs its implied entailment), not ImpScore's data; not
   comparable with the paper's EIS numbers. One-vector rows (r = u) score 0 by
   construction (equal implicitness counts as a failure).
7. No SimCSE(SNLI+MNLI) row (not shipped; only a 27k-triplet SNLI reduction is).

**Paper (seed text's RTE table, accuracy %).**

{_paper_table()}
"""]
    if claims:
        parts.append(claims)
    for rule in RULES:
        from dualcse_jax.evaluate import RULE_TEXT

        parts.append(f"## Score rule `{rule}`: {RULE_TEXT[rule]}\n")
        if SIMCSE in results:
            parts.append("RTE accuracy (%); interval: average − SimCSE(INLI).\n")
            parts.append(grid.results_table(_view(results, rule, present), COLUMNS,
                                            reference=SIMCSE, primary="average",
                                            num_samples=args.num_samples))
            parts.append("\nImplied-entailment accuracy − SimCSE(INLI) (the class DualCSE "
                         "targets).\n")
            parts.append(grid.results_table(_view(results, rule, present), ("implied",),
                                            reference=SIMCSE, primary="implied",
                                            num_samples=args.num_samples))
            parts.append("\nThe paper's comparisons under this rule only (all rules and AUCs "
                         "together: Claims, above).\n")
            parts.append(comparisons(results, rule, args.num_samples))
        else:
            parts.append(grid.results_table(_view(results, rule, present), COLUMNS,
                                            reference=None, primary="average"))
        ablation = [s for s in (CROSS, NO_CONTRA, NO_INTRA) if s in results]
        if CROSS in results and len(ablation) > 1:
            parts.append("\nAblations: average − DualCSE-Cross.\n")
            parts.append(grid.results_table(_view(results, rule, ablation), COLUMNS,
                                            reference=CROSS, primary="average",
                                            num_samples=args.num_samples))
        parts.append("")
    raw = {s: results[s] for s in present if "sims/test/implied" in results[s][0][1]}
    if raw:
        parts.append("## Threshold-free: ROC-AUC and average precision (%) per class\n")
        lacking = [s for s in present if s not in raw]
        parts.append(f"Every row at the end of its run (step —). {dualcse_curves.AUC_NOTE}"
                     + (f"Not here: {', '.join(lacking)} (their cells kept no raw cosines; "
                        "delete a cell's folder and re-run the command to add them).\n"
                        if lacking else ""))
        for rule in dualcse_curves.ONE_SCORE_RULES:
            parts.append(f"### Score `{rule}`\n")
            parts.append(dualcse_curves.auc_table(raw, rule, args.num_samples) + "\n")
    eis = {s: [(seed, {"EIS proxy": sc["eis_proxy"]}) for seed, sc in results[s]]
           for s in present}
    parts.append("## EIS (INLI PROXY: premise vs its implied entailment, 1,000 test pairs)\n")
    parts.append(grid.results_table(eis, ("EIS proxy",),
                                    reference=CROSS if CROSS in eis else None,
                                    primary="EIS proxy", num_samples=args.num_samples))
    return "\n".join(parts) + "\n"


def main(argv=None) -> None:
    p = grid.parser("dualcse", __doc__)
    p.add_argument("--steps", type=grid.positive_int, default=None,
                   help="override every trained run's step count (a few: a smoke test; the "
                        "preset's own is 200, cross_cpu.py's budget); the default root "
                        "becomes workdirs/experiments/dualcse-<preset>-steps<N>")
    args = p.parse_args(argv)
    from embedding_core.cli import enable_compilation_cache, quiet_library_logs

    enable_compilation_cache()  # seeds 1 and 2 reuse seed 0's compiled steps
    quiet_library_logs()
    specs = grid_specs(args.preset, args.steps)
    if args.preset == "cpu" and not args.steps:
        specs += dualcse_curves.curve_specs()
    if args.list:
        for s in specs:
            print(s.key)
        return
    root = grid.grid_root(args, "dualcse")
    if args.steps and not args.root:
        root = root.parent / f"{root.name}-steps{args.steps}"
    elif not args.root and args.results == str(grid.RESULTS_DIR):
        grid.restore_cells("dualcse", specs, root)  # cells this checkout's results hold
    results = grid.run_grid(specs, root, only=args.only, table_only=args.table_only,
                            optional=lambda key: "sims/" in key)  # raw cosines: newer cells
    if not results:
        print("no finished run yet; no table written")
        return
    curve_rows = {c.row for c in dualcse_curves.CURVES} | {dualcse_curves.CURVE_BASELINE_ROW}
    grid_rows = {k: v for k, v in results.items() if k not in curve_rows}
    curves = {k: v for k, v in results.items() if k in curve_rows}
    claims = dualcse_claims.section(grid_rows, curves, args.num_samples)
    text = report(grid_rows, args, claims)
    text += "\n" + dualcse_curves.section(curves, args.num_samples)
    grid.write_results("dualcse", text, results, args.results, specs=specs, root=root)


if __name__ == "__main__":
    grid.main_of("dualcse", main)
