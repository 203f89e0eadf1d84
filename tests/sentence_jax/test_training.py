"""A file with columns anchor,positive,negative trains with its negatives: they reach the
loss, and a 2-step run on the 8 devices ends with a finite loss and a checkpoint."""

from __future__ import annotations

import csv
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentence_jax import losses, trainer
from sentence_jax.configs import default


def _triplets(path, n=16):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["anchor", "positive", "negative"])
        for i in range(n):
            writer.writerow([f"question number {i}", f"answer {i} here", f"unrelated {i} text"])
    return path


@pytest.fixture()
def config(tmp_path, tiny_bert_dir):
    config = default.get_config()
    config.model = str(tiny_bert_dir)
    config.train_files = str(_triplets(tmp_path / "triplets.csv"))
    config.update(batch_size=8, max_seq_length=16, num_train_steps=2, log_every=1,
                  checkpoint_every=2, dropout=False)
    return config


def test_the_negative_column_reaches_the_loss(config):
    from data_pipelines.tokenization import load_tokenizer

    task = trainer.build_task(config)
    batch = next(iter(task.make_batches(0)))
    assert [batch[f"input_ids_{c}"].shape[:2] for c in range(3)] == [(8, 1)] * 3
    tokenizer = load_tokenizer(config.model)
    first = [tokenizer.decode(ids[:n].tolist()) for ids, n in zip(
        batch["input_ids_2"][:, 0], batch["attention_mask_2"][:, 0].sum(-1), strict=True)]
    assert all(text.startswith("unrelated ") for text in first), first
    params = nn.meta.unbox(task.init_params(jax.random.key(0)))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    rng = jax.random.key(1)
    value, _ = task.loss_fn(params, batch, rng)
    emb = task.loss_fn.embed(params, batch, jnp.arange(8), rng)
    mnrl = losses.MultipleNegativesRankingLoss()
    assert float(value) == pytest.approx(float(mnrl([emb[:, 0], emb[:, 1], emb[:, 2]])),
                                         abs=1e-6)
    assert abs(float(value) - float(mnrl([emb[:, 0], emb[:, 1]]))) > 1e-3


def test_each_column_is_padded_to_its_own_longest_and_the_loss_is_unchanged(config,
                                                                             tmp_path):
    """group_padding (sentence-transformers' collator): column c is [rows, 1, its longest];
    with dropout off the loss and its gradients equal one width for all columns."""
    path = tmp_path / "lengths.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["anchor", "positive"])
        for i in range(8):
            writer.writerow([f"a much longer question number {i} with many words in it",
                             f"short {i}"])
    config.update(train_files=str(path), pad_multiple=1)
    params = None
    results = []
    for grouped in (True, False):
        config.group_padding = grouped
        task = trainer.build_task(config)
        batch = next(iter(task.make_batches(0)))
        if grouped:
            real = [int(batch[f"attention_mask_{c}"].sum(-1).max()) for c in range(2)]
            assert [batch[f"input_ids_{c}"].shape for c in range(2)] == \
                [(8, 1, real[0]), (8, 1, real[1])] and real[0] > real[1] + 4
        else:
            assert batch["input_ids"].shape == (8, 2, max(real))
        params = params or nn.meta.unbox(task.init_params(jax.random.key(0)))
        batch = {k: jnp.asarray(v) for k, v in batch.items() if k != "step"}
        results.append(jax.value_and_grad(lambda p, b=batch, t=task: t.loss_fn(
            p, b, jax.random.key(1))[0])(params))
    (grouped_loss, grouped_grads), (loss, grads) = results
    assert float(grouped_loss) == pytest.approx(float(loss), abs=1e-6)
    # Sums over other padded lengths: float32 rounding, measured as in test_cached_and_mesh.
    pairs = list(zip(jax.tree.leaves(grouped_grads), jax.tree.leaves(grads), strict=True))
    diff = np.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in pairs))
    assert diff / np.sqrt(sum(float(np.sum(b * b)) for _, b in pairs)) < 1e-5


def test_two_steps_train_and_checkpoint(config, tmp_path):
    state = trainer.train(config, tmp_path / "run")
    assert int(state.step) == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    losses_seen = [r["loss"] for r in rows if "loss" in r]
    assert len(losses_seen) == 2 and all(np.isfinite(losses_seen))
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_a_matryoshka_dim_above_the_models_is_named(config):
    config.matryoshka_dims = "999,16"
    with pytest.raises(ValueError) as err:
        trainer.build_task(config)
    assert str(err.value) == ("config.matryoshka_dims=[999, 16]: the model's embeddings "
                              "have 32 dimensions")
