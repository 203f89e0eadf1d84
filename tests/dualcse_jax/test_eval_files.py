"""--config.eval_files in training: a 3-step DualCSE run scores the files at each eval
step into metrics.jsonl, and --config.select_metric keeps the best step for load()."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import shared_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval_data import write_eval_files  # noqa: E402


def test_eval_files_are_logged_and_select_metric_keeps_the_best_step(tmp_path, tiny_bert_dir):
    from dualcse_jax import load, workflows
    from dualcse_jax.configs import default
    from embedding_core.training import checkpoints

    files = write_eval_files(tmp_path / "data", rows=8)
    config = default.get_config()
    # DUALCSE_TINY's 3 steps: the train step is the shared run's, from the compile cache.
    config.update(dict(shared_runs.DUALCSE_TINY, model=str(tiny_bert_dir),
                       eval_every=1, checkpoint_every=100,
                       keep_checkpoints=1, eval_files=f"ir:{files['ir']},sts:{files['sts']}",
                       select_metric="implicit/sts/spearman_cosine"))
    workdir = tmp_path / "run"
    workflows.train(config, workdir)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in rows if r["split"] == "eval"}
    assert sorted(evals) == [1, 2, 3]
    for row in evals.values():
        assert {"explicit/ir/cosine_ndcg@10", "implicit/ir/dot_map@100",
                "implicit/sts/spearman_cosine", "explicit/sts/pearson_manhattan"} <= set(row)
        assert not any(k.startswith("val_rte") for k in row)  # the files replace INLI RTE
    values = {s: r["implicit/sts/spearman_cosine"] for s, r in evals.items()}
    best = max(values, key=lambda s: (values[s], -s))  # a later step must be strictly better
    saved = json.loads((workdir / checkpoints.BEST_FILE).read_text())
    assert saved == {"metric": "implicit/sts/spearman_cosine", "value": pytest.approx(values[best]),
                     "step": best}
    kept = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert best in kept and 3 in kept
    assert load(workdir).step == best  # evaluate and export take the selected step


def test_bad_eval_files_are_refused_before_training(tmp_path, tiny_bert_dir):
    from dualcse_jax import workflows
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update(dict(shared_runs.DUALCSE_TINY, model=str(tiny_bert_dir), eval_every=1,
                       eval_files="sts"))
    with pytest.raises(ValueError, match="write KIND:PATH"):
        workflows.train(config, tmp_path / "a")
    config.eval_files = f"sts:{tmp_path / 'missing.csv'}"
    with pytest.raises(FileNotFoundError,
                       match=rf"^config.eval_files: {tmp_path}/missing.csv does not exist$"):
        workflows.train(config, tmp_path / "b")
    assert not (tmp_path / "b").exists()  # refused before the workdir is made
