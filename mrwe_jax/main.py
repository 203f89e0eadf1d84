"""mrwe-jax: multi-resolution word embeddings + ConvRR/FCRR retrieval on SQuAD.

Usage:
  mrwe-jax train    --config=CONFIG.py --workdir=DIR [--config.FIELD=VALUE ...]
  mrwe-jax evaluate --workdir=DIR [--also=DIR2,...] [--pool=test|all]
  mrwe-jax export   --workdir=DIR --output=OUT_DIR [--export_split=all|test]
  mrwe-jax export-hf --workdir=DIR --output=OUT_DIR
  mrwe-jax demo     --workdir=DIR [--num_train_steps=N]

train     builds (or reads from the cache) the multi-resolution features of SQuAD, then
          trains the configured tower (ConvRR or FCRR) with the batch-hard triplet loss on
          the training questions into DIR: run_config.json, features.json, TensorBoard events,
          orbax checkpoints. CONFIG.py defaults to mrwe_jax/configs/default.py (the papers'
          settings); configs/convrr_cpu.py and configs/fcrr_cpu.py are the CPU presets.
          Your own data: --config.squad_path=FILE (SQuAD v1.1 JSON or zip, local or
          gs://; split into train/test by article; docs/data.md).
evaluate  recall@{1,2,3,5,10,20,50} of the right paragraph for every test question over
          the pool (default: config.eval_pool; "test" = all paragraphs of the test
          articles, "all" = every paragraph): TF-IDF, BM25, each single source, the
          ensemble and the trained tower(s) of DIR (and --also) in one table; writes
          DIR/eval/recall_<pool>.json and the t-SNE picture DIR/eval/tsne.png.
export    question and paragraph embeddings of the trained tower: OUT_DIR/questions and
          OUT_DIR/paragraphs, each embeddings.npy (float32 [N, d''], unit rows), ids.txt
          (SQuAD question ids / "title#index" paragraph ids) and meta.json
          (embedding_core.export.load_export reads them).
export-hf writes the trained tower as plain files into a new OUT_DIR: tower.safetensors
          (Flax parameters), run_config.json, features.json and idf.json (the feature
          recipe); mrwe_jax.workflows.load_tower_export(OUT_DIR) encodes with it alone. A
          tower reads word features, not tokens: no sentence-transformers folder
          (docs/export.md).
demo      the shipped run: features, ConvRR and FCRR with the CPU presets on the training
          articles of SQuAD dev, the tables for both pools and the t-SNE picture
          (DIR/convrr, DIR/fcrr).
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags, logging

from embedding_core.cli import define_workdir_flags, parse_command, run_app, user_errors

_DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
COMMANDS = ("train", "evaluate", "export", "export-hf", "demo")

define_workdir_flags(_DEFAULT_CONFIG, "Training directory (demo: its parent of runs).")
flags.DEFINE_list("also", [], "evaluate: more workdirs whose towers join the table.")
flags.DEFINE_enum("pool", None, ["test", "all"], "evaluate: retrieval pool "
                  "(default: the workdir's config.eval_pool).")
flags.DEFINE_string("output", None, "export, export-hf: output directory.")
flags.DEFINE_enum("export_split", "all", ["all", "test"],
                  "export: every question and paragraph, or the test questions and pool.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    command = parse_command(argv, COMMANDS)
    with user_errors("mrwe-jax", command):
        from mrwe_jax import workflows

        if command == "train":
            from data_pipelines.paths import absolute_data_paths

            # Saved with the run: evaluate and resume find the file from any directory.
            workflows.train(absolute_data_paths(FLAGS.config, ("squad_path",)), FLAGS.workdir)
            print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
        elif command == "evaluate":
            workflows.evaluate_workdirs([FLAGS.workdir, *FLAGS.also], pool=FLAGS.pool,
                                        step=FLAGS.step)
        elif command == "export":
            if not FLAGS.output:
                raise app.UsageError("export needs --output=DIR")
            workflows.export_workdir(FLAGS.workdir, FLAGS.output, split=FLAGS.export_split,
                                     step=FLAGS.step)
        elif command == "export-hf":
            if not FLAGS.output:
                raise app.UsageError("export-hf needs --output=DIR")
            workflows.export_hf_workdir(FLAGS.workdir, FLAGS.output, step=FLAGS.step)
        else:
            logging.set_verbosity(logging.WARNING)  # the demo prints its own progress
            workflows.run_demo(FLAGS.workdir, num_train_steps=FLAGS.num_train_steps)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
