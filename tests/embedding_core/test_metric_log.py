"""embedding_core.training.metric_log: TensorBoard scalars, metrics.jsonl and the training plot
(docs/architecture.md, "What a workdir holds")."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from embedding_core.training import metric_log


def scalars(workdir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(workdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_scalars_jsonl_and_plot_of_a_run_that_resumes(tmp_path):
    log = metric_log.MetricLog(tmp_path, start_step=0)
    log.write_hparams({"learning_rate": 0.1, "model": "tiny", "nested": {"a": 1}})
    for step, loss in ((1, 2.0), (2, 1.5), (3, 1.25)):
        log.write(step, {"loss": loss, "learning_rate": 0.1 * step})
    log.write(2, {"acc": 0.25, "count": 7}, metric_log.EVAL)
    log.sync()  # the checkpoint at step 2; then the process dies after logging step 3
    log._writer.close()
    log._jsonl.close()

    # Resumed from the checkpoint at step 2: step 3 is trained (and logged) again.
    log = metric_log.MetricLog(tmp_path, start_step=2)
    log.write(3, {"loss": 0.5, "learning_rate": 0.3})
    log.write(4, {"loss": float("nan"), "learning_rate": 0.4})
    log.write(4, {"acc": 0.75, "count": 7}, metric_log.EVAL)
    log.close()

    got = scalars(tmp_path)
    assert sorted(got) == ["acc", "count", "learning_rate", "loss"]
    # The first run's step 3 is gone; simple_value is float32.
    assert got["loss"][:3] == [(1, 2.0), (2, 1.5), (3, 0.5)]
    assert got["loss"][3][0] == 4 and np.isnan(got["loss"][3][1])
    assert got["acc"] == [(2, 0.25), (4, 0.75)]
    assert [v for _, v in got["learning_rate"]] == pytest.approx([0.1, 0.2, 0.3, 0.4])

    rows = metric_log.read_metrics(tmp_path)
    assert [(r["step"], r["split"]) for r in rows] == [
        (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (4, "train"), (4, "eval")]
    assert [r.get("loss") for r in rows if r["split"] == "train"] == [2.0, 1.5, 0.5, None]
    assert rows[2] == {"step": 2, "split": "eval", "wall_time": rows[2]["wall_time"],
                       "acc": 0.25, "count": 7.0}

    png = (tmp_path / metric_log.PLOT_FILE).read_bytes()
    image = Image.open(io.BytesIO(png))
    image.verify()
    # loss, learning rate, evaluation and its legend
    assert image.format == "PNG" and image.size == (3 * 460 + 180, 380)
    assert not [p.name for p in (tmp_path / "plots").iterdir() if p.name != "training.png"]


def test_plot_without_evaluation_has_two_panels():
    rows = [{"step": 1, "split": "train", "loss": 1.0, "learning_rate": 0.1},
            {"step": 1, "split": "eval", "num_queries": 12.0}]  # a count is not plotted
    image = Image.open(io.BytesIO(metric_log.plot_metrics(rows)))
    assert image.size == (2 * 460, 380)
    with pytest.raises(ValueError, match="no training loss"):
        metric_log.plot_metrics(rows[1:])


def test_a_malformed_metrics_file_names_its_line_and_a_torn_last_line_is_skipped(tmp_path):
    good = json.dumps({"step": 1, "split": "train", "loss": 1.0})
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n{{\"step\": 2, \"spl")
    assert [r["step"] for r in metric_log.read_metrics(tmp_path)] == [1]
    (tmp_path / "metrics.jsonl").write_text(f"{good}\n{{\"step\": \"2\"}}\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: field 'step'"):
        metric_log.read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("{oops\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 1: not JSON"):
        metric_log.MetricLog(tmp_path)
    assert not list(tmp_path.glob("events.out.tfevents*"))  # refused before writing
    with pytest.raises(ValueError, match="reserved"):
        metric_log.MetricLog(tmp_path / "new", active=False).write(1, {"step": 1.0})


def test_a_run_logs_loss_and_evaluation_as_scalars_and_draws_its_plot(tmp_path):
    import flax.linen as nn
    import jax.numpy as jnp

    from embedding_core import configs
    from embedding_core.training.run import run
    from embedding_core.training.task import Task

    x = np.linspace(-1, 1, 16, dtype=np.float32)[:, None]
    y = 3 * x[:, 0]
    model = nn.Dense(1, use_bias=False, kernel_init=nn.with_logical_partitioning(
        nn.initializers.zeros, ("embed", "mlp")))

    def loss_fn(params, batch, rng):
        return jnp.mean((model.apply({"params": params}, batch["x"])[:, 0] - batch["y"]) ** 2), {}

    def evaluate(params, step):  # the mean squared error on all rows
        return {"mse": float(np.mean((x[:, 0] * float(params["kernel"][0, 0]) - y) ** 2))}

    def batches(start):
        while True:
            yield {"x": x[:8], "y": y[:8]}

    task = Task(name="line", init_params=lambda k: model.init(k, x[:1])["params"],
                loss_fn=loss_fn, make_batches=batches, num_examples=8, steps_per_epoch=1,
                global_batch_size=8, evaluate=evaluate)
    config = configs.base()
    config.update(dict(batch_size=8, learning_rate=0.1, lr_decay="constant",
                       num_train_steps=4, log_every=1, checkpoint_every=4, eval_every=2))
    state = run(lambda config, mesh: task, config, tmp_path)

    got = scalars(tmp_path)
    assert {"loss", "grad_norm", "learning_rate", "mse"} <= set(got)
    rows = metric_log.read_metrics(tmp_path)
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert got["loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train]
    assert train[0]["loss"] == pytest.approx(float(np.mean(y[:8] ** 2)), rel=1e-6)  # w = 0
    final = evaluate(state.params, 4)["mse"]
    assert [s for s, _ in got["mse"]] == [2, 4]
    assert got["mse"][1][1] == pytest.approx(final, rel=1e-6) and final < got["mse"][0][1]
    Image.open(tmp_path / metric_log.PLOT_FILE).verify()


def test_a_resumed_file_sorts_last_when_the_writer_counter_gains_a_digit(tmp_path, monkeypatch):
    # Two event files in one second of one process, counter 9 then 10: by name "...10"
    # sorts before "...9", and TensorBoard would keep the first run's redone step 3.
    from tensorboard.summary.writer import event_file_writer

    counter = event_file_writer.AtomicCounter(9)
    monkeypatch.setattr(event_file_writer, "_global_uid", counter)
    log = metric_log.MetricLog(tmp_path, start_step=0)
    for step in (1, 2, 3):
        log.write(step, {"loss": float(step)})
    log.close()
    log = metric_log.MetricLog(tmp_path, start_step=2)
    log.write(3, {"loss": 0.5})
    log.close()
    assert scalars(tmp_path)["loss"] == [(1, 1.0), (2, 2.0), (3, 0.5)]
