"""dualcse-jax: train, evaluate and export DualCSE sentence embeddings.

Usage:
  dualcse-jax train    --config=CONFIG.py --workdir=DIR [--config.FIELD=VALUE ...]
  dualcse-jax evaluate --workdir=DIR [--baseline] [--eis_data=ImpScore.csv]
  dualcse-jax export   --workdir=DIR --input=SENTENCES.txt --output=OUT_DIR
  dualcse-jax demo     --workdir=DIR

train     trains (or resumes) into DIR: config.json, TensorBoard events, orbax checkpoints.
          CONFIG.py defaults to dualcse_jax/configs/default.py (the paper's settings);
          dualcse_jax/configs/cross_cpu.py is the small CPU preset of the README.
evaluate  RTE on INLI test with the threshold tuned on INLI val; prints the table and
          writes DIR/eval/rte.json ({"explicit","implied","neutral","contradiction",
          "average","threshold"}, accuracies in [0,1]). --baseline adds the untrained
          MiniLM (mean pooling) row. EIS: on --eis_data (ImpScore CSV, test split of
          random.seed(42)) or, without it, on the INLI proxy (labelled as a proxy).
demo      the README's main job: train DualCSE-Cross from MiniLM on INLI with the CPU
          preset (configs/cross_cpu.py), evaluate next to the untrained MiniLM, export the
          INLI test premises' embeddings, print where everything is.
export    encodes one sentence per line of --input and writes OUT_DIR/explicit.npy and
          implicit.npy (float32 [N, dim], row i = line i), ids.txt and meta.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from embedding_core.cli import run_app

_DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
COMMANDS = ("train", "evaluate", "export", "demo")

config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Training configuration file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Training directory (checkpoints, config, eval).")
flags.DEFINE_string("input", None, "export: text file, one sentence per line (UTF-8).")
flags.DEFINE_string("output", None, "export: output directory.")
flags.DEFINE_integer("step", None, "evaluate/export: checkpoint step (default: latest).")
flags.DEFINE_bool("baseline", False, "evaluate: also score the untrained model.")
flags.DEFINE_string("eis_data", None, "evaluate: ImpScore-format CSV for EIS.")
flags.DEFINE_integer("num_train_steps", None, "demo: override the CPU preset's step count.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"give one command: {' | '.join(COMMANDS)} (see --help)")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    from dualcse_jax import workflows

    command = argv[1]
    if command == "demo":
        workflows.run_demo(FLAGS.workdir, FLAGS.num_train_steps)
    elif command == "train":
        from dualcse_jax.trainer import train

        train(FLAGS.config, FLAGS.workdir)
        print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
    elif command == "evaluate":
        workflows.evaluate_workdir(FLAGS.workdir, step=FLAGS.step, baseline=FLAGS.baseline,
                         eis_data=FLAGS.eis_data)
    else:
        if not FLAGS.input or not FLAGS.output:
            raise app.UsageError("export needs --input=FILE and --output=DIR")
        workflows.export_workdir(FLAGS.workdir, FLAGS.input, FLAGS.output, step=FLAGS.step)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
