"""Each method trains 2 steps on a user's file from examples/data (docs/data.md, "Your own
data"): DualCSE through the CLI with val_file, DocEnt with its queries file, MRWE on a
SQuAD-format file; SimCSE rows without a hard negative get in-batch negatives only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "data"


def test_dualcse_cli_trains_on_my_pairs_csv(tmp_path, tiny_bert_dir, capsys, cli,
                                            monkeypatch):
    workdir = tmp_path / "run"
    monkeypatch.chdir(REPO)
    # Relative paths from the repository root: the saved config must hold absolute ones.
    proc = cli(
        "dualcse_jax.main", "train",
        "--config=dualcse_jax/configs/cross_cpu.py",
        "--config.train_file=examples/data/my_pairs.csv",
        "--config.val_file=examples/data/my_pairs.csv",
        f"--config.model={tiny_bert_dir}", "--config.num_train_steps=2",
        "--config.batch_size=8", "--config.max_length=32", "--config.log_every=1",
        "--config.eval_every=2", "--config.eval_examples=8", f"--workdir={workdir}",
        # A child process: one device (the tests' 8 fake ones cost compile time and add
        # nothing here).
        env={"EMBEDDING_JAX_CACHE": str(tmp_path / "cache"), "XLA_FLAGS": "",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 16 examples" in proc.stderr  # the file's 16 rows
    # Console metric lines, RTE on the val_file during training, TensorBoard event files.
    assert "loss=" in proc.stderr and "val_rte_average=" in proc.stderr
    assert list(workdir.glob("events.out.tfevents*"))
    assert (workdir / "checkpoints" / "2").is_dir()
    saved = json.loads((workdir / "run_config.json").read_text())
    assert saved["train_file"] == saved["val_file"] == str(EXAMPLES / "my_pairs.csv")

    from dualcse_jax import workflows

    with pytest.raises(ValueError, match="only config.val_file, config.test_file and "
                       "config.eval_rte_score_rule"):
        workflows.evaluate_workdir(workdir, overrides={"seed": 1})
    capsys.readouterr()
    # The run's val_file tunes the threshold, the override replaces INLI test.
    out = workflows.evaluate_workdir(workdir, progress=False,
                                     overrides={"test_file": str(EXAMPLES / "my_pairs.csv")})
    printed = capsys.readouterr().out
    assert f"on {EXAMPLES / 'my_pairs.csv'}, threshold tuned on {EXAMPLES / 'my_pairs.csv'}" \
        in printed
    assert list(out["rte"]) == ["DualCSE-cross (step 2)"]


def test_docent_trains_on_my_docs_and_ranks_my_queries(tmp_path, tiny_bert_dir, monkeypatch):
    from docent_jax import trainer, workflows
    from docent_jax.configs import dual_cpu

    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    config = dual_cpu.get_config()
    config.update(dict(model=str(tiny_bert_dir), train_file=str(EXAMPLES / "my_docs.jsonl"),
                       eval_queries_file=str(EXAMPLES / "my_queries.jsonl"),
                       num_train_steps=2, batch_size=8, max_length=32, warmup_steps=0,
                       log_every=1, eval_every=0))
    workdir = tmp_path / "docent"
    state = trainer.train(config, workdir)
    assert int(state.step) == 2
    assert (workdir / "entity_ids.txt").read_text().split() == [
        "bakery", "library", "lighthouse", "observatory"]
    rows = workflows.evaluate_workdir(workdir, baselines=False, progress=False)
    (metrics,) = rows.values()
    assert metrics["num_queries"] == 4


def test_mrwe_trains_on_my_squad_json(tmp_path, monkeypatch):
    from mrwe_jax import data, trainer
    from mrwe_jax.configs import convrr_cpu

    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    config = convrr_cpu.get_config()
    config.update(dict(squad_path=str(EXAMPLES / "my_squad.json"), sources="tfidf",
                       tfidf_dim=16, num_train_steps=2, log_every=1, paragraphs_per_batch=8,
                       questions_per_paragraph=2, eval_every=0))
    corpus = data.load_corpus_of(config)
    # 5 articles x 3 paragraphs x 2 questions; one article (3 paragraphs) is test.
    assert (len(corpus.paragraph_ids), len(corpus.question_ids)) == (15, 30)
    assert (int(corpus.train_questions.sum()), int(corpus.test_questions.sum())) == (24, 6)
    state = trainer.train(config, tmp_path / "mrwe")
    assert int(state.step) == 2


def test_simcse_file_rows_without_hard_negative(minilm_dir):
    from data_pipelines.tokenization import load_tokenizer
    from dualcse_jax import data
    from dualcse_jax.configs import simcse

    config = simcse.get_config()
    config.update(dict(train_file=str(EXAMPLES / "my_simcse.jsonl"), max_length=32))
    table = data.train_table(config, load_tokenizer(minilm_dir))
    assert table.field_names == ("anchor", "positive", "hard_negative")
    same = table.text_ids[:, 2] == table.text_ids[:, 1]
    assert same.tolist() == [False, False, False, True, False, True, False, False]  # lines 4, 6


def test_simcse_loss_drops_a_hard_negative_equal_to_its_positive():
    import jax.numpy as jnp

    from dualcse_jax.loss import simcse_loss

    rng = np.random.default_rng(0)
    e = rng.normal(size=(4, 3, 8)).astype(np.float32)
    # Rows 1 and 3 carry no hard negative: their slot repeats the positive's identity.
    ids = np.array([[0, 1, 2], [3, 4, 4], [5, 6, 7], [8, 9, 9]], np.int32)
    loss, _ = simcse_loss(jnp.asarray(e), jnp.asarray(ids), temperature=0.1)

    unit = e / np.linalg.norm(e, axis=-1, keepdims=True)
    keys = np.concatenate([unit[:, 1], unit[[0, 2], 2]])  # 4 positives + 2 hard negatives
    logits = unit[:, 0] @ keys.T / 0.1
    expected = np.mean([np.log(np.exp(logits[i]).sum()) - logits[i, i] for i in range(4)])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
