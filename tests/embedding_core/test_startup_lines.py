"""What training prints before its first step: a new user saw nothing for 16 s, then the
run's summary, then nothing until the first step's compile ended. Now a line names the
model and data before they load, and one says the step compiles, before the first step's
metrics; the compile ahead of the step is the step's own (``embedding_core/training/loop.py``)."""

import logging

import jax

from tests.shared_runs import DUALCSE_TINY


def test_training_says_what_it_loads_and_compiles_before_the_first_step(
        tmp_path, tiny_bert_dir, caplog):
    from dualcse_jax import workflows
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update(dict(DUALCSE_TINY, model=str(tiny_bert_dir), num_train_steps=2))
    with caplog.at_level(logging.INFO), jax.log_compiles(True):
        workflows.train(config, tmp_path / "run")
    messages = [r.getMessage() for r in caplog.records]

    def where(starts: str) -> list[int]:
        return [i for i, m in enumerate(messages) if m.startswith(starts)]

    loading = where(f"loading model={tiny_bert_dir} and the training data ...")
    summary = where("training DualCSE-cross for 2 steps on 64 examples")
    compiling = where("compiling the train step (the first step only) ...")
    metrics = where("[1] ") + where("[2] ")
    assert len(loading) == len(summary) == len(compiling) == 1, messages
    assert len(metrics) == 2, messages
    assert loading[0] < summary[0] < compiling[0] < metrics[0] < metrics[1], messages
    # One compile of the step, after the line announcing it: the first step reused it.
    compiles = where("Compiling jit(step)")
    assert len(compiles) == 1 and compiling[0] < compiles[0] < metrics[0], messages
