"""Trained tiny runs shared across test files (session fixtures in tests/conftest.py).

Even a 3-step run of the tiny BERT costs a train-step compilation (~10 s on 2 cores), so
the tests that only need *a* trained DualCSE or DocEnt-Dual workdir share one, and tests
that must train the same configuration themselves (in another process, killed and
resumed) use these exact settings: their compiled step then comes from the persistent
compile cache, and the shared run's parameters are their uninterrupted reference.

The shared workdirs are read-only: a test that writes into a workdir (``evaluate``
writes ``eval/``) works on a copy (:func:`copy_run`). The session fixtures check at the
end of the session that no file of them changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

DUALCSE_TINY = {"architecture": "cross", "pooling": "cls_mlp", "normalize": False,
                "max_length": 32, "batch_size": 8, "num_train_steps": 3,
                "max_train_examples": 64, "learning_rate": 1e-3, "warmup_steps": 0,
                "log_every": 1, "checkpoint_every": 3, "eval_every": 0,
                "eval_batch_size": 16}
"""DualCSE-cross with SimCSE's tanh head (``cls_mlp``), 3 steps on 64 INLI train rows,
dropout on (the default); what a CLI run gets from ``--config.FIELD=VALUE`` of each."""


@dataclasses.dataclass(frozen=True)
class SharedRun:
    workdir: Path  # read-only: copy it (copy_run) to write into it
    overrides: dict  # the config fields set on top of the package's default config
    params: dict[str, np.ndarray] = dataclasses.field(repr=False)  # final, by keystr path


def train_dualcse_tiny(workdir: Path, model_dir: Path) -> SharedRun:
    """Trains :data:`DUALCSE_TINY` on ``model_dir`` into ``workdir`` with
    ``dualcse_jax.workflows.train`` (what ``dualcse-jax train`` calls), in this process."""
    import jax

    from dualcse_jax import workflows
    from dualcse_jax.configs import default

    overrides = dict(DUALCSE_TINY, model=str(model_dir))
    config = default.get_config()
    config.update(overrides)
    state = workflows.train(config, workdir)
    params = {jax.tree_util.keystr(k): np.asarray(v)
              for k, v in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))}
    return SharedRun(workdir, overrides, params)


DOCENT_WORDS = ["river", "castle", "music", "engine", "forest"]
DOCENT_DOCS = "".join(json.dumps({"entity": f"E_{w}", "text": f"The {w} number {k} is here."})
                      + "\n" for k in range(4) for w in DOCENT_WORDS)
"""The training file of :data:`DOCENT_TINY`: 5 entities, 4 sentences each (JSON Lines)."""

DOCENT_TINY = {"variant": "dual", "softmax": "in_batch", "pooling": "cls",
               "projection_dim": 16, "max_length": 16, "batch_size": 8, "num_train_steps": 3,
               "warmup_steps": 1, "dropout": True, "learning_rate": 1e-3,
               "entity_learning_rate": 1e-2, "log_every": 1, "checkpoint_every": 3,
               "eval_every": 0, "eval_batch_size": 4}
"""DocEnt-Dual with a 16-wide projection after CLS pooling, 3 steps on :data:`DOCENT_DOCS`
(``train_file`` is set where the file is written); dropout, a warm-up step and separate
entity / encoder rates make a resumed run's restored state matter; encoding in batches of
4 splits even a few queries into several calls."""


def train_docent_tiny(workdir: Path, model_dir: Path) -> SharedRun:
    """Writes :data:`DOCENT_DOCS` beside ``workdir`` and trains :data:`DOCENT_TINY` on it
    with ``docent_jax.trainer.train`` (what ``docent-jax train`` calls), in this process."""
    import jax

    from docent_jax import trainer
    from docent_jax.configs import default

    docs = workdir.parent / "docs.jsonl"
    docs.write_text(DOCENT_DOCS, encoding="utf-8")
    overrides = dict(DOCENT_TINY, model=str(model_dir), train_file=str(docs))
    config = default.get_config()
    config.update(overrides)
    state = trainer.train(config, workdir)
    params = {jax.tree_util.keystr(k): np.asarray(v)
              for k, v in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))}
    return SharedRun(workdir, overrides, params)


def fingerprint(folder: Path) -> dict[str, str]:
    """SHA-1 of every file under ``folder``, by relative path."""
    return {p.relative_to(folder).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(run: SharedRun, dest: Path) -> Path:
    """A writable copy of the shared workdir at ``dest``."""
    shutil.copytree(run.workdir, dest)
    return dest
