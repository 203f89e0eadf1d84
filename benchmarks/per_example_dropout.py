"""Cost of per-example dropout keys: the SimCSE CPU train step with and without them.

The training losses run the encoder on each example alone under ``jax.vmap`` with the key
``fold_in(step key, row)`` when dropout is on (``embedding_core.losses.contrastive.per_example``),
so that masks do not depend on chunking or the mesh. This times that step against the
batched form it replaced (one key for the whole batch), interleaved, same weights, same
batch (MiniLM shape, random tokens, batch 32 x 3 sentences, max length 64, CLS pooling,
AdamW), and prints the median step times and their ratio::

  .venv/bin/python benchmarks/per_example_dropout.py [--dropout_impl=hash|flax] [--repeats=10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dropout_impl", default="hash", choices=("hash", "flax"))
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from dualcse_jax.configs import simcse
    from dualcse_jax.data import model_inputs
    from dualcse_jax.loss import simcse_loss
    from dualcse_jax.model import build_model, init_fn, sentence_text_ids
    from dualcse_jax.trainer import make_loss_fn
    from embedding_core.distributed import parallel
    from embedding_core.models.pretrained import load_pretrained
    from embedding_core.training import training

    c = simcse.get_config()
    c.pooling, c.max_length, c.dropout, c.dropout_impl = "cls", 64, True, args.dropout_impl
    model = build_model(c, load_pretrained(c.model).config)
    mesh = parallel.make_mesh(1, 1, devices=jax.devices()[:1])

    def batched_loss(params, batch, rng):  # the step before: one key for the whole batch
        r, _ = model.apply({"params": params}, *model_inputs(batch), deterministic=False,
                           rngs={"dropout": rng})
        return simcse_loss(r, sentence_text_ids(batch["text_ids"], "simcse"),
                           temperature=c.temperature)

    rng = np.random.default_rng(0)
    rows, length = 32, 64
    mask = (np.arange(length) < rng.integers(16, length + 1, (rows, 3, 1))).astype(np.int32)
    ids = rng.integers(1000, 30000, (rows, 3, length)).astype(np.int32) * mask
    batch = parallel.host_to_global(
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids),
         "text_ids": np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)}, mesh)
    tx, _ = training.make_optimizer(learning_rate=1e-5, total_steps=100)
    steps = {}
    for name, loss_fn in (("batched", batched_loss), ("per_example", make_loss_fn(model, c))):
        state, shardings = training.create_sharded_state(init_fn(model), tx, mesh,
                                                         jax.random.key(0))
        step = training.make_train_step(loss_fn, shardings, mesh)
        state, metrics = step(state, batch, jax.random.key(1))  # compiles
        jax.block_until_ready(metrics)
        steps[name] = [step, state]
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, (step, state) in steps.items():
            start = time.perf_counter()
            state, metrics = step(state, batch, jax.random.key(1))
            jax.block_until_ready(metrics)
            times[name].append(time.perf_counter() - start)
            steps[name][1] = state
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["per_example"] / median["batched"]
    print(f"dropout_impl={args.dropout_impl}: batched {median['batched'] * 1e3:.0f} ms, "
          f"per-example {median['per_example'] * 1e3:.0f} ms per step; per-example / "
          f"batched = {ratio:.3f}")
    return {**median, "ratio": ratio}


if __name__ == "__main__":
    main()
