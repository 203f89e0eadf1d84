"""docent-jax: train, evaluate and export DocEnt-Dual entity embeddings.

Usage:
  docent-jax train    --workdir=DIR [--config=CONFIG.py] [--config.FIELD=VALUE ...]
  docent-jax evaluate --workdir=DIR [--nobaselines]
  docent-jax export   --workdir=DIR [--output=OUT_DIR] [--input=QUERIES.txt]
  docent-jax demo     --workdir=DIR [--num_train_steps=N] [--config=CONFIG.py]

train     trains (or resumes) DocEnt-Dual into DIR: config.json, entity_ids.txt, TensorBoard
          events, orbax checkpoints. CONFIG.py defaults to docent_jax/configs/default.py;
          docent_jax/configs/dual_cpu.py is the small CPU preset. --config.softmax picks
          the denominator of P(e | s): in_batch (the paper) or full_vocab (every entity of
          the table, vocabulary-parallel).
evaluate  zero-shot entity ranking of the held-out queries (SQuAD: questions of held-out
          paragraphs, entities = articles): MAP, MRR, recall@1/5/10, NDCG@10, next to the
          Bag-of-Sentences (MiniLM, GloVe) and TF-IDF baselines; prints the table and writes
          DIR/eval/ranking.json.
export    writes OUT_DIR (default DIR/export)/entities/: embeddings.npy float32
          [num_entities, dim] (the table g), ids.txt (line i = entity of row i) and
          meta.json; with --input (one query per line) also OUT_DIR/queries/ (f of each
          query, ids.txt = the queries). Raw vectors: compare with cosine.
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
flags.DEFINE_string("input", None, "export: a text file of queries, one a line; their "
                    "vectors f(q) go to OUTPUT/queries/.")
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
            workflows.export_workdir(FLAGS.workdir, FLAGS.output, input_path=FLAGS.input,
                                     step=FLAGS.step)
        else:
            config = FLAGS.config if FLAGS["config"].present else None
            workflows.run_demo(FLAGS.workdir, config, FLAGS.num_train_steps)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
