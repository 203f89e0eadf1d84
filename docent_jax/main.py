"""docent-jax: train, evaluate and export DocEnt-Dual entity embeddings.

Usage:
  docent-jax train    --workdir=DIR [--config=CONFIG.py] [--config.FIELD=VALUE ...]
  docent-jax evaluate --workdir=DIR [--nobaselines]
  docent-jax export   --workdir=DIR [--output=OUT_DIR]
  docent-jax demo     --workdir=DIR [--num_train_steps=N] [--config=CONFIG.py]

train     trains (or resumes) DocEnt-Dual into DIR: config.json, entity_ids.txt, TensorBoard
          events, orbax checkpoints. CONFIG.py defaults to docent_jax/configs/default.py;
          docent_jax/configs/dual_cpu.py is the small CPU preset.
evaluate  zero-shot entity ranking of the held-out queries (SQuAD: questions of held-out
          paragraphs, entities = articles): MAP, MRR, recall@1/5/10, NDCG@10, next to the
          Bag-of-Sentences (MiniLM, GloVe) and TF-IDF baselines; prints the table and writes
          DIR/eval/ranking.json.
export    streams the entity table to OUT_DIR (default DIR/export): entities.npy float32
          [num_entities, dim] (row i = line i of entity_ids.txt), entity_ids.txt, meta.json.
demo      trains with the CPU preset (configs/dual_cpu.py unless --config is given),
          evaluates with baselines, exports; prints the table and the timings.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from embedding_core.cli import define_workdir_flags, parse_command, run_app, user_errors

COMMANDS = ("train", "evaluate", "export", "demo")

define_workdir_flags(str(Path(__file__).parent / "configs" / "default.py"))
flags.DEFINE_string("output", None, "export: output directory (default WORKDIR/export).")
flags.DEFINE_bool("baselines", True, "evaluate: also score BoS-MiniLM, BoS-GloVe, TF-IDF.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    command = parse_command(argv, COMMANDS)
    from docent_jax import workflows

    with user_errors("docent-jax", command):
        if command == "train":
            from docent_jax.trainer import train

            train(FLAGS.config, FLAGS.workdir)
            print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
        elif command == "evaluate":
            workflows.evaluate_workdir(FLAGS.workdir, step=FLAGS.step,
                                       baselines=FLAGS.baselines)
        elif command == "export":
            workflows.export_workdir(FLAGS.workdir, FLAGS.output, step=FLAGS.step)
        else:
            config = FLAGS.config if FLAGS["config"].present else None
            workflows.run_demo(FLAGS.workdir, config, FLAGS.num_train_steps)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
