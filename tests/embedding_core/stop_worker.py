"""A tiny linear-regression run under the CLI's error handling, for the signal tests.

``python stop_worker.py WORKDIR NUM_STEPS SLOW_FROM``: trains ``y = x @ [1, 2, 3, 4]`` with
``embedding_core.training.run.run`` inside ``cli.user_errors`` (so the exit code is the CLI's). When
the loop asks for the batch of step ``SLOW_FROM`` or later it prints ``READY <step>`` once
on stdout and waits there until the file ``WORKDIR.go`` exists (then takes 0.05 s per
batch); a negative ``SLOW_FROM`` prints ``READY load`` while the task loads its data
(start-up), waits there for ``WORKDIR.go`` the same way and prints ``LOADED`` once the load
ends. A test signals the worker after ``READY`` and only then creates ``WORKDIR.go``
(:func:`release`): the signal is always handled at that point of the run, however slowly a
loaded machine runs either process, and no outcome depends on a wall-clock time.
``test_run_stops.py`` imports ``make_task`` and ``config`` for its uninterrupted reference.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from embedding_core import configs
from embedding_core.training.task import Task

DIM, ROWS, BATCH = 4, 64, 8


class Linear(nn.Module):
    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.zeros, ("mlp", "embed")), (DIM, 1))
        return (x @ w)[:, 0]


def go_file(workdir) -> Path:
    """The file whose creation lets a waiting worker go on (beside its workdir, which a
    test checks for files the run wrote)."""
    return Path(f"{workdir}.go")


def release(workdir) -> None:
    """Lets the worker training into ``workdir`` go on from where it printed ``READY``."""
    go_file(workdir).touch()


def _wait_for(go: Path) -> None:
    # A signal sent before ``go`` was created interrupts the sleep (or arrives with the
    # stat that finds ``go``): its handler has run before this returns.
    while not go.exists():
        time.sleep(0.01)


def config(num_steps: int, **overrides):
    c = configs.base()
    c.batch_size = BATCH
    c.learning_rate = 0.05
    c.lr_decay = "constant"
    c.num_train_steps = num_steps
    c.log_every = 1
    c.checkpoint_every = 1000
    c.eval_every = 0
    for k, v in overrides.items():
        c[k] = v
    return c


def make_task(slow_from: int | None = None, on_slow=None, go: Path | None = None):
    """The task; ``on_slow(step)`` (default: print ``READY step``, then wait until the file
    ``go`` exists when given) runs once at ``slow_from``; a negative ``slow_from`` prints
    ``READY load`` in the data load and waits for ``go`` there (``LOADED`` when it ends)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    y = x @ np.arange(1, DIM + 1, dtype=np.float32)
    model = Linear()

    def make_batches(start_step):
        step, told = start_step, False
        while True:
            if slow_from is not None and step >= slow_from:
                if not told:
                    if on_slow is None:
                        print(f"READY {step}", flush=True)
                        if go is not None:
                            _wait_for(go)
                    else:
                        on_slow(step)
                    told = True
                time.sleep(0.05)
            rows = np.random.default_rng(step).choice(ROWS, BATCH, replace=False)
            yield {"x": x[rows], "y": y[rows], "step": np.int32(step)}
            step += 1

    def loss_fn(params, batch, rng):
        err = model.apply({"params": params}, batch["x"]) - batch["y"]
        return jnp.mean(err ** 2), {}

    def make(config, mesh):
        if slow_from is not None and slow_from < 0:  # start-up: the data "loads" until go
            print("READY load", flush=True)
            if go is not None:
                _wait_for(go)
            print("LOADED", flush=True)
        return Task(name="linear", init_params=lambda k: model.init(k, x[:1])["params"],
                    loss_fn=loss_fn, make_batches=make_batches, num_examples=ROWS,
                    steps_per_epoch=ROWS // BATCH, global_batch_size=BATCH)

    return make


if __name__ == "__main__":
    from embedding_core.cli import user_errors
    from embedding_core.training.run import run

    workdir, num_steps, slow_from = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with user_errors("stop-worker", "train"):
        run(make_task(slow_from, go=go_file(workdir)), config(num_steps), workdir)
    print("DONE", flush=True)
