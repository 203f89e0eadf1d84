"""--config.eval_files on DocEnt: the query encoder scores the files in training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import shared_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval_data import write_eval_files  # noqa: E402


def test_eval_files_are_logged_at_each_eval_step(tmp_path, tiny_bert_dir):
    from docent_jax import trainer
    from docent_jax.configs import default

    files = write_eval_files(tmp_path / "data", rows=6)
    docs = tmp_path / "docs.jsonl"
    docs.write_text(shared_runs.DOCENT_DOCS, encoding="utf-8")
    config = default.get_config()
    config.update(dict(shared_runs.DOCENT_TINY, model=str(tiny_bert_dir), train_file=str(docs),
                       num_train_steps=2, eval_every=2,
                       eval_files=f"sts:{files['sts']},pairs:{files['pairs']}"))
    trainer.train(config, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    (row,) = [r for r in rows if r["split"] == "eval"]
    assert row["step"] == 2
    assert {"sts/spearman_cosine", "pairs/cosine_ap", "pairs/max_f1"} <= set(row)


def test_a_users_query_file_is_named_as_such(docent_tiny_run, tmp_path, capsys):
    from docent_jax import workflows

    workdir = shared_runs.copy_run(docent_tiny_run, tmp_path / "run")  # evaluate writes eval/
    queries = tmp_path / "my_queries.jsonl"
    queries.write_text("".join(json.dumps({"query": f"Where is the {w}?", "entities": [f"E_{w}"]})
                               + "\n" for w in shared_runs.DOCENT_WORDS))
    workflows.evaluate_workdir(workdir, baselines=False, progress=False,
                               overrides={"eval_queries_file": str(queries)})
    out = capsys.readouterr().out
    assert f"5 queries from {queries} over 5 entities" in out and "held-out" not in out
