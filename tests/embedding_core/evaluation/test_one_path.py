"""One evaluation path: the same IR, STS and pairs files scored by ``config.eval_files`` in
a 3-step run, by ``dualcse-jax evaluate`` and by ``embedding-jax evaluate`` on that run
give the same numbers, all at the one default batch size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import shared_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eval_data import write_eval_files  # noqa: E402

KINDS = ("ir", "sts", "pairs")


def test_eval_files_package_evaluate_and_embedding_jax_evaluate_agree(tmp_path, tiny_bert_dir,
                                                                     cli):
    from dualcse_jax import workflows
    from dualcse_jax.configs import default
    from embedding_core.evaluation import cli as evaluate_cli
    from embedding_core.training.metric_log import read_metrics

    files = write_eval_files(tmp_path / "data", rows=8)
    flags = [f"--{kind}={files[kind]}" for kind in KINDS]
    config = default.get_config()
    config.update({k: v for k, v in shared_runs.DUALCSE_TINY.items() if k != "eval_batch_size"})
    # DUALCSE_TINY's 3 steps: the train step is the shared run's, from the compile cache.
    config.update(model=str(tiny_bert_dir), eval_every=3, checkpoint_every=3,
                  eval_files=",".join(f"{kind}:{files[kind]}" for kind in KINDS))
    workdir = tmp_path / "run"
    workflows.train(config, workdir)
    row = next(r for r in read_metrics(workdir) if r["split"] == "eval" and r["step"] == 3)
    trained = {kind: {name[len(f"implicit/{kind}/"):]: value for name, value in row.items()
                      if name.startswith(f"implicit/{kind}/")} for kind in KINDS}

    assert evaluate_cli.main([f"--model={workdir}", "--view=implicit", *flags,
                              f"--output={tmp_path / 'embedding_jax.json'}"]) == 0
    # The package CLI through the cli fixture: in this process (its absl flags afresh),
    # and in the slow tier in a child process on one device.
    done = cli("dualcse_jax.main", "evaluate", f"--workdir={workdir}", "--view=implicit",
               *flags, f"--output={tmp_path / 'package.json'}", env={"XLA_FLAGS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("embedding_jax", "package"):
        results = json.loads((tmp_path / f"{name}.json").read_text())["results"]
        assert sorted(results) == sorted(KINDS)
        for kind in KINDS:
            assert results[kind]["file"] == str(files[kind])
            assert results[kind]["metrics"].keys() == trained[kind].keys(), (name, kind)
            # Equal, not close: the same checkpoint's vectors through the same evaluators
            # (an approximate check would hide a second batch size or parser).
            assert results[kind]["metrics"] == trained[kind], (name, kind)
    assert {"cosine_ndcg@10", "cosine_accuracy@1"} <= trained["ir"].keys()
    assert {"spearman_cosine", "pearson_dot"} <= trained["sts"].keys()
    assert {"cosine_ap", "manhattan_f1"} <= trained["pairs"].keys()
