"""The README's main job: train DualCSE-Cross from MiniLM on shipped INLI, evaluate, export.

``python -m dualcse_jax.demo --workdir=DIR`` (what ``make demo`` runs):

1. trains DualCSE-Cross with the CPU preset (``configs/cross_cpu.py``) on INLI train,
   resuming if DIR already holds checkpoints;
2. evaluates RTE on INLI test (threshold tuned on INLI val) next to the untrained MiniLM
   baseline, plus the EIS INLI proxy;
3. exports both embeddings of the INLI test premises;
4. prints where everything is.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from absl import app, flags, logging

flags.DEFINE_string("workdir", "workdirs/dualcse_cross_cpu", "Output directory.")
flags.DEFINE_integer("num_train_steps", None, "Override the preset's number of steps.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    import jax

    from data_pipelines import inli
    from dualcse_jax.configs import cross_cpu
    from dualcse_jax.main import evaluate_workdir, export_workdir
    from dualcse_jax.trainer import train

    jax.config.update("jax_compilation_cache_dir",
                      str(Path(FLAGS.workdir).resolve().parent / ".jax_cache"))
    workdir = Path(FLAGS.workdir)
    config = cross_cpu.get_config()
    if FLAGS.num_train_steps:
        config.num_train_steps = FLAGS.num_train_steps
    t0 = time.time()
    print(f"[1/3] training DualCSE-Cross from {config.model} on INLI train "
          f"({config.num_train_steps} steps x {config.batch_size} premises) -> {workdir}")
    train(config, workdir)
    t1 = time.time()
    print(f"[2/3] evaluating RTE on INLI test (and the untrained baseline)")
    result = evaluate_workdir(workdir, baseline=True)
    t2 = time.time()
    premises_file = workdir / "inli_test_premises.txt"
    premises = [ex.premise for ex in inli.read_inli(inli.inli_split_path("test"))]
    tmp = premises_file.with_suffix(".tmp")
    tmp.write_text("\n".join(premises) + "\n", encoding="utf-8")
    os.replace(tmp, premises_file)
    print(f"[3/3] exporting both embeddings of the {len(premises)} INLI test premises")
    export_dir = workdir / "export_test_premises"
    export_workdir(workdir, str(premises_file), str(export_dir))
    t3 = time.time()
    rows = result["rte"]
    trained, base = (rows[k] for k in rows)
    print("\nSummary")
    print(f"  trained   implied {100 * trained['implied']:.2f}%  average "
          f"{100 * trained['average']:.2f}%")
    print(f"  untrained implied {100 * base['implied']:.2f}%  average "
          f"{100 * base['average']:.2f}%")
    print(f"  time: train {t1 - t0:.0f}s, evaluate {t2 - t1:.0f}s, export {t3 - t2:.0f}s")
    print(f"  checkpoints:  {workdir / 'checkpoints'}")
    print(f"  TensorBoard:  tensorboard --logdir {workdir}")
    print(f"  RTE results:  {workdir / 'eval' / 'rte.json'} (baseline: rte_baseline.json)")
    print(f"  embeddings:   {export_dir}/explicit.npy, implicit.npy, ids.txt, meta.json")


def run() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.set_verbosity(logging.WARNING)
    sys.modules["__main__"].__doc__ = sys.modules["__main__"].__doc__ or __doc__
    app.run(main)


if __name__ == "__main__":
    run()
