"""experiments/dualcse.py without training: configs, the sibling count, the report."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from experiments import dualcse, grid


def test_trained_rows_share_pooling_optimiser_and_premises_per_step():
    for preset in ("cpu", "gpu"):
        configs = {k: dualcse.run_config(k, preset, 0) for k in dualcse.SYSTEMS}
        cross = configs["cross"]
        for key, c in configs.items():
            assert (c.pooling, c.max_length, c.num_train_steps, c.dropout_impl) == (
                cross.pooling, cross.max_length, cross.num_train_steps, cross.dropout_impl), key
            premises = c.batch_size // 2 if c.architecture == "simcse" else c.batch_size
            if preset == "cpu" or key != "bi":
                assert (premises, c.learning_rate) == (cross.batch_size, cross.learning_rate)
        assert configs["simcse"].train_data == "inli" and cross.pooling == "mean"
        assert not configs["cross-nocontra"].use_contradiction
        assert not configs["cross-nointra"].use_intra
    gpu = dualcse.run_config("bi", "gpu", 1)
    assert (gpu.batch_size, gpu.learning_rate, gpu.num_train_steps, gpu.seed) == (32, 3e-5, 0, 1)
    assert dualcse.run_config("cross", "cpu", 0, steps=3).num_train_steps == 3


def test_sibling_count_follows_the_pipeline_order():
    from data_pipelines.pipeline import _StepBatcher
    from data_pipelines.table import TokenTable

    premises, batch, steps = 20, 8, 12  # 5 steps per epoch: the count crosses two epochs
    n = 2 * premises
    table = TokenTable(np.zeros((n, 3, 2)), np.zeros((n, 3, 2)), np.ones((n, 3)),
                       np.stack([np.arange(n) // 2] * 3, axis=1), ("a", "p", "h"))
    for seed in (0, 5):
        order = _StepBatcher(table, global_batch_size=batch, seed=seed, process_index=0,
                             process_count=1, pad_multiple=1, fixed_length=None,
                             groups=[[0, 1, 2]])
        with_pair, pairs = 0, 0
        for step in range(steps):
            anchors = table.text_ids[order.global_rows(step), 0]
            k = batch - len(set(anchors.tolist()))
            with_pair, pairs = with_pair + (k > 0), pairs + k
        assert dualcse.sibling_meetings(premises, batch, seed, steps) == (with_pair, pairs)
        assert pairs > 0  # the case is not vacuous


def _fake_results(seed=0, raw=False):
    rng = np.random.default_rng(seed)

    def scores(p):
        out = {}
        if raw:  # entailed pairs' cosines shifted up by a system's own margin
            for c in dualcse.CLASSES:
                shift = 3 * p if c in ("explicit", "implied") else 0.0
                out.update({f"sims/{split}/{c}": rng.normal(size=(50, 2)) + shift
                            for split in ("val", "test")})
        for rule in dualcse.RULES:
            parts = [(rng.random(50) < p).astype(float) for _ in dualcse.CLASSES]
            out.update({f"{rule}/{c}": v for c, v in zip(dualcse.CLASSES, parts, strict=True)})
            out[f"{rule}/average"] = grid.macro_average_items(parts)
        out["eis_proxy"] = (rng.random(20) < p).astype(float)
        return out

    results = {dualcse.BASELINE: [(None, scores(0.5))]}
    for key, p in (("simcse", 0.6), ("cross", 0.9), ("bi", 0.7)):
        results[dualcse.SYSTEMS[key][0]] = [(s, scores(p)) for s in dualcse.SEEDS]
    for key in dualcse.ABLATIONS:
        results[dualcse.SYSTEMS[key][0]] = [(0, scores(0.8))]
    return results


def test_report_has_a_table_per_rule_and_the_papers_signs():
    args = argparse.Namespace(preset="cpu", steps=None, num_samples=500)
    text = dualcse.report(_fake_results(), args)
    for rule in dualcse.RULES:
        assert f"## Score rule `{rule}`" in text
    assert grid.MINILM_NOTE in text and "Departures from the paper" in text
    assert text.count("| DualCSE-Cross − SimCSE(INLI), average | +0.78 |") == 4
    # Cross is far better than SimCSE in the fake data: the paper's sign holds.
    line = next(ln for ln in text.splitlines()
                if ln.startswith("| DualCSE-Cross − SimCSE(INLI), average"))
    assert line.endswith("| holds |")
    assert "| SimCSE(INLI) | 79.40 |" not in text  # the paper table lists every class
    assert "| SimCSE(INLI) | 90.60 | 69.10 | 66.90 | 91.00 | 79.40 |" in text
    assert "## EIS (INLI PROXY" in text and "Ablations: average − DualCSE-Cross" in text


def test_comparison_verdicts():
    results = _fake_results()
    same = {k: v for k, v in results.items()}
    same[dualcse.CROSS] = same[dualcse.SIMCSE]  # identical items: interval [0, 0]
    text = dualcse.comparisons(same, "max", 200)
    assert "| DualCSE-Cross − SimCSE(INLI), average | +0.78 | +0.00 [+0.00, +0.00] | not " \
           "resolved (interval covers 0) |" in text
    worse = dict(results)
    worse[dualcse.CROSS], worse[dualcse.SIMCSE] = results[dualcse.SIMCSE], results[dualcse.CROSS]
    assert "| reversed |" in dualcse.comparisons(worse, "max", 500)


def test_steps_must_be_positive():
    with pytest.raises(SystemExit):
        dualcse.main(["--steps=0", "--list"])


def test_grid_rows_with_raw_cosines_get_the_auc_table():
    from embedding_core.evaluation import metrics
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap_statistic
    from experiments import dualcse_curves as dc

    args = argparse.Namespace(preset="cpu", steps=None, num_samples=300)
    assert "## Threshold-free" not in dualcse.report(_fake_results(), args)
    results = _fake_results(raw=True)
    results[dualcse.NO_INTRA] = _fake_results()[dualcse.NO_INTRA]  # a cell without cosines
    text = dualcse.report(results, args).split("## Threshold-free", 1)[1]
    assert f"Not here: {dualcse.NO_INTRA} (their cells kept no raw cosines" in text
    max_block = text.split("### Score `max`", 1)[1].split("###", 1)[0]
    rows = [ln.split("|")[1].strip() for ln in max_block.splitlines() if ln.startswith("| ")]
    assert rows[1:] == [dualcse.BASELINE, dualcse.SIMCSE, dualcse.CROSS, dualcse.BI,
                        dualcse.NO_CONTRA]  # after the header; no w/o intra row
    cells = [c.strip() for c in next(ln for ln in max_block.splitlines()
                                     if ln.startswith(f"| {dualcse.CROSS} |")).split("|")[1:-1]]
    (x, y), (xr, _) = (dc._seed_scores(results[s], "all", "max")
                       for s in (dualcse.CROSS, dualcse.SIMCSE))
    assert cells[1] == "—" and cells[-1] == format_interval(
        paired_bootstrap_statistic(metrics.roc_auc_rows, x, xr, y, num_samples=300))
    assert float(cells[-1].split("[")[1].split(",")[0]) > 0  # margin 2.7 against 1.8
