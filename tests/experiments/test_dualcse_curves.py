"""experiments/dualcse_curves.py without training: configs, threshold-free items, the
section's tables; grid.restore_cells round trip."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import dualcse_curves as dc
from experiments import grid
from experiments.dualcse_cells import CLASSES, RULES


def test_curve_configs_keep_the_preset_but_the_schedule_and_batch():
    cross = dc.curve_config(dc.CURVES[1], 2)
    assert (cross.architecture, cross.num_train_steps, cross.batch_size, cross.seed,
            cross.learning_rate) == ("cross", 500, 16, 2, 1e-4)
    paper = {c.key: dc.curve_config(c, 0) for c in dc.CURVES if c.premises == 64}
    assert (paper["simcse"].batch_size, paper["cross"].batch_size) == (128, 64)
    assert paper["cross"].learning_rate == 5e-5 and paper["cross"].num_train_steps == 125
    keys = [s.key for s in dc.curve_specs()]
    assert len(keys) == len(set(keys)) == 1 + sum(len(c.seeds) for c in dc.CURVES)
    assert dc._reference(dc.CURVES[3].row) == dc.CURVES[0].row  # nointra vs SimCSE-500


def test_class_items_pair_each_class_with_the_opposite_label():
    sims = {c: np.full((3, 2), i, float) for i, c in enumerate(CLASSES)}
    sims["implied"][:, 1] = 9.0  # only the implicit cosine is high
    s, y = dc.class_items(sims, "implied", "implicit")
    assert s.tolist() == [9.0] * 3 + [2.0] * 3 + [3.0] * 3
    assert y.tolist() == [True] * 3 + [False] * 6
    s, y = dc.class_items(sims, "neutral", "explicit")
    assert s.tolist() == [2.0] * 3 + [0.0] * 3 + [1.0] * 3 and y.sum() == 6
    assert dc.class_items(sims, "all", "max")[0].size == 12


def _fake_curve_results():
    rng = np.random.default_rng(0)

    def stage(gap):
        out = {}
        for rule in RULES:
            parts = [(rng.random(40) < 0.7).astype(float) for _ in CLASSES]
            out.update({f"{rule}/{c}": v for c, v in zip(CLASSES, parts, strict=True)})
            out[f"{rule}/average"] = grid.macro_average_items(parts)
        for c in CLASSES:
            for split in ("val", "test"):
                shift = gap if c in ("explicit", "implied") else 0.0
                out[f"sims/{split}/{c}"] = rng.normal(size=(40, 2)) + shift
        return out

    def run(steps, gap):
        return {f"step{s}/{k}": v for s in steps for k, v in stage(gap).items()}

    simcse, cross = dc.CURVES[0], dc.CURVES[1]
    return {dc.CURVE_BASELINE_ROW: [(None, stage(1.0))],
            simcse.row: [(s, run(simcse.at, 1.0)) for s in (0, 1)],
            cross.row: [(s, run(cross.at, 3.0)) for s in (0, 1)]}


def test_section_tables_every_rule_and_auc_against_simcse():
    text = dc.section(_fake_curve_results(), num_samples=200)
    for rule in RULES:
        assert f"rule `{rule}`" in text
    for rule in dc.ONE_SCORE_RULES:
        assert f"#### Score `{rule}`" in text
    cross = next(ln for ln in text.splitlines()
                 if ln.startswith(f"| {dc.CURVES[1].row} | 500 |"))
    cells = [c.strip() for c in cross.strip("|").split("|")]
    assert float(cells[2]) > 95  # explicit separated by a gap of 3 sd
    low = float(cells[-1].split("[")[1].split(",")[0])
    assert low > 0  # Cross's AUC clearly above SimCSE's in the fake data


def test_restore_cells_round_trip(tmp_path):
    results = _fake_curve_results()
    specs = [s for s in dc.curve_specs() if s.system in results and (s.seed or 0) < 2]
    root = tmp_path / "grid"
    for spec in specs:  # a finished grid, written as run_grid writes it
        scores = dict(next(sc for sd, sc in results[spec.system] if sd == spec.seed))
        grid.save_scores(root / spec.key / grid.SCORES_FILE, scores)
        (root / spec.key / grid.CELL_FILE).write_text(
            '{"commit": "abc1234", "seconds": 60, "finished": "2026-12-03 10:00 UTC"}')
    got = grid.run_grid(specs, root, table_only=True)
    grid.write_results("curves", "# t", got, tmp_path / "res", specs=specs, root=root)
    fresh = tmp_path / "fresh"
    assert sorted(grid.restore_cells("curves", specs, fresh, tmp_path / "res")) == sorted(
        s.key for s in specs)
    again = grid.run_grid(specs, fresh, table_only=True)
    for system, runs in got.items():
        for (s1, a), (s2, b) in zip(runs, again[system], strict=True):
            assert s1 == s2 and a.keys() == b.keys()
            for k in a:
                np.testing.assert_allclose(b[k], a[k], rtol=1e-7)
    assert grid.provenance(specs, fresh) == grid.provenance(specs, root)
    assert grid.restore_cells("curves", specs, fresh, tmp_path / "res") == []


@pytest.mark.parametrize("values", [np.array([0.0, 1.0]), np.array([0.1, 1 / 3])])
def test_compact_loses_nothing(values):
    small = grid._compact(values)
    assert np.array_equal(small.astype(np.float64), values)


def test_verdict_names_every_step_and_the_sign():
    text = dc.verdict(_fake_curve_results(), num_samples=200)
    assert text.count("  - step ") == 3
    assert "AUC(all) Δ max +" in text  # Cross's fake cosines separate the classes better


def test_budget_paragraph_words_the_numbers():
    results = _fake_curve_results()
    text = dc.budget_paragraph(results, num_samples=200)
    from embedding_core.evaluation.stats import format_interval
    first = dc._gap(results, dc.CURVES[1].row, 100, "max", 200, False)
    assert f"went from {format_interval(first)} at step 100" in text
    assert "DualCSE-Cross 2 seed(s), SimCSE 2" in text
    # The fake Cross separates entailed pairs far better: AUC(all) clearly above SimCSE.
    auc = dc._gap(results, dc.CURVES[1].row, 500, "max", 200, True)
    assert auc.low > 0 and f"to {format_interval(auc)}; at step 500" in text
    # The signs at the last step, grouped; then the verdict on the longest schedule.
    final = dc._final_gaps(results, dc.CURVES[1].row, 500, 200)
    ahead = [m for m, iv in final.items() if iv.low > 0]
    assert "AUC max" in ahead
    assert f"Cross ahead (the paper's sign) under {', '.join(ahead)}" in text
    moved = first.mean_difference < dc._gap(results, dc.CURVES[1].row, 500, "max", 200,
                                             False).mean_difference
    assert ("narrows Cross's gap on every schedule" if moved else "does not narrow") in text
    last = dc._gap(results, dc.CURVES[1].row, 500, "max", 200, False)
    change = 100 * (last.mean_difference - first.mean_difference)
    assert f"({change:+.2f} points, toward {'DualCSE-Cross' if moved else 'SimCSE'})" in text
    assert "by step 500 of the 500-step schedule" in text
    assert ("Cells not yet run: curve-simcse-sched500-b16-seed2, "
            "curve-cross-sched500-b16-seed2, curve-bi-sched500-b16-seed0, ") in text
    assert dc.budget_paragraph({dc.CURVES[0].row: results[dc.CURVES[0].row]}, 200) == ""
    # The paper-batch curves score one step: a level, not "went from X to X".
    paper = [c for c in dc.CURVES if c.premises == 64]
    one = {c.row: [(s, {k: v for k, v in sc.items() if k.startswith("step500/")})
                   for s, sc in results[dc.CURVES[i].row]]
           for i, c in enumerate(paper)}
    one = {row: [(s, {k.replace("step500/", "step125/"): v for k, v in sc.items()})
                 for s, sc in runs] for row, runs in one.items()}
    text = dc.budget_paragraph(one, num_samples=200)
    assert "64 premises per step, lr 5e-05" in text and "went from" not in text
    assert "Cross − SimCSE at step 125 is " in text


def test_claims_summary_words_hand_made_signs():
    from experiments.dualcse_claims import summary
    assert summary({"max": "holds", "AUC max": "holds"}) == "holds under every measure"
    assert summary({"max": "not resolved (interval covers 0)"}) == "open under every measure"
    assert summary({"max": "holds", "explicit": "reversed", "pair": "holds",
                    "AUC max": "not resolved (interval covers 0)"}) == (
        "holds under max, pair; reversed under explicit; open under AUC max")


def test_claims_table_rows_are_the_paired_intervals():
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap
    from experiments import dualcse_claims as claims
    from experiments.dualcse_cells import CROSS, SIMCSE

    results = _fake_curve_results()
    labels = [label for label, _ in claims.budgets({}, results)]
    assert labels == [f"{dc.EPOCH_STEPS}-step schedule, step {s}" for s in (100, 250, 500)]
    text = claims.claims_table({}, results, num_samples=200)
    cross, simcse = CROSS, SIMCSE
    row = next(ln for ln in text.splitlines()
               if ln.startswith(f"| {cross} − {simcse}, average")
               and "step 500 |" in ln)
    cells = [c.strip() for c in row.strip("|").split("|")]
    runs, ref = (dc._at(results[c.row], 500) for c in (dc.CURVES[1], dc.CURVES[0]))
    a, b = grid.seed_mean(runs), grid.seed_mean(ref)
    for i, rule in enumerate(RULES):
        assert cells[3 + i] == format_interval(
            paired_bootstrap(a[f"{rule}/average"], b[f"{rule}/average"], num_samples=200))
    # The fake Cross separates entailed pairs by 3 sd against SimCSE's 1: AUC holds the
    # paper's sign (Cross above SimCSE) under both one-score rules.
    for i, _ in enumerate(dc.ONE_SCORE_RULES):
        assert float(cells[3 + len(RULES) + i].split("[")[1].split(",")[0]) > 0
    holds = next(part for part in cells[-1].split("; ") if part.startswith("holds under"))
    assert holds == "holds under every measure" or all(
        f"AUC {r}" in holds for r in dc.ONE_SCORE_RULES)
    assert claims.claims_table({}, {dc.CURVES[0].row: results[dc.CURVES[0].row]}, 200) == ""
