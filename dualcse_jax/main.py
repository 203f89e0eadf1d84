"""dualcse-jax: train, evaluate and export DualCSE sentence embeddings.

Usage:
  dualcse-jax train    --config=CONFIG.py --workdir=DIR [--config.FIELD=VALUE ...]
  dualcse-jax evaluate --workdir=DIR [--baseline] [--eis_data=ImpScore.csv]
                       [--config.val_file=V.csv] [--config.test_file=T.csv]
                       [--rte_score_rules=max,explicit,implicit,pair | all]
  dualcse-jax export   --workdir=DIR --input=SENTENCES.txt --output=OUT_DIR [--normalize]
  dualcse-jax export-hf --workdir=DIR --output=OUT_DIR
  dualcse-jax demo     --workdir=DIR [--config=PRESET.py] [--config.FIELD=VALUE ...]
  dualcse-jax preprocess --config=CONFIG.py --output=DIR [--num_shards=8]

train     trains (or resumes) into DIR: run_config.json, encoder/ (HF config and tokenizer),
          TensorBoard events, orbax checkpoints.
          CONFIG.py defaults to dualcse_jax/configs/default.py (the paper's settings);
          dualcse_jax/configs/cross_cpu.py is the small CPU preset of the README.
          Your own data: --config.train_file=PATH (CSV or JSON Lines, local or gs://;
          --config.val_file / --config.test_file for RTE; docs/data.md).
          --config.train_shards=DIR streams a corpus written by preprocess instead.
evaluate  RTE on INLI test with the threshold tuned on INLI val; prints the table and
          writes DIR/eval/rte.json ({"explicit","implied","neutral","contradiction",
          "average","threshold"}, accuracies in [0,1]). --baseline adds MiniLM off
          the shelf (mean pooling; NLI-trained by its authors) as a row. EIS: on
          --eis_data (ImpScore CSV, ImpScore's own random.Random(42) split) or,
          without it, on the INLI proxy (labelled as a proxy).
          The run's --config.val_file / test_file replace INLI val / test; given on the
          evaluate line, they change the sets for this evaluation only.
          RTE score rule: the run's config.eval_rte_score_rule (max: max(cos(r_p, r_h),
          cos(u_p, r_h)); explicit: cos(r_p, r_h); implicit: cos(u_p, r_h); pair: either
          cosine above its own val-tuned threshold); --rte_score_rules=all prints a table
          per rule from one encoding (rte.json: "rules"), without retraining.
demo      the README's main job: train DualCSE-Cross from MiniLM on INLI with the CPU
          preset (configs/cross_cpu.py, or --config), evaluate next to MiniLM off
          the shelf, export the INLI test premises' embeddings, print where everything is.
export    encodes one sentence per line of --input into OUT_DIR/explicit/ (r) and
          OUT_DIR/implicit/ (u), each with embeddings.npy (float32 [N, dim], row i =
          line i), ids.txt and meta.json (model, config, step, normalized, similarity);
          --normalize writes unit-length rows. embedding_core.export.load_export reads it.
export-hf writes the trained encoder for Hugging Face / sentence-transformers (no JAX
          needed to use it): OUT_DIR/explicit/ (r) and OUT_DIR/implicit/ (u), each loaded by
          SentenceTransformer(folder).encode(sentences) or transformers.AutoModel. The
          cross-encoder's indicator word is in each folder's tokenizer: pass plain sentences.
          A simcse run is one folder, OUT_DIR. OUT_DIR must be new or empty (docs/export.md).
preprocess tokenises the training rows CONFIG.py describes once into --num_shards ArrayRecord
          shards under --output (local or gs://) with a manifest.json; train with
          --config.train_shards=DIR and each host reads only its shards (docs/data.md,
          "Sharded corpora"). --num_shards: a multiple of the number of training hosts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags

from embedding_core import preprocess
from embedding_core.cli import define_workdir_flags, parse_command, run_app, user_errors

COMMANDS = ("train", "evaluate", "export", "export-hf", "demo", "preprocess")

define_workdir_flags(str(Path(__file__).parent / "configs" / "default.py"))
flags.DEFINE_string("input", None, "export: text file, one sentence per line (UTF-8).")
flags.DEFINE_string("output", None, "export, export-hf, preprocess: output directory.")
flags.DEFINE_bool("baseline", False,
                  "evaluate: also score the pretrained checkpoint as it is (not trained here).")
flags.DEFINE_string("eis_data", None, "evaluate: ImpScore-format CSV for EIS.")
flags.DEFINE_string("rte_score_rules", None, "evaluate: comma-separated RTE score rules "
                    "(max, explicit, implicit, pair) or 'all', one table each from one "
                    "encoding (default: the run's config.eval_rte_score_rule).")
flags.DEFINE_bool("normalize", None, "export: unit-length rows (default: the run's "
                  "config.normalize, False unless set).")
preprocess.define_flags()
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    command = parse_command(argv, COMMANDS)
    from dualcse_jax import workflows

    with user_errors("dualcse-jax", command):
        if command == "demo":
            config = FLAGS.config if FLAGS["config"].present else None
            workflows.run_demo(FLAGS.workdir, FLAGS.num_train_steps, config=config)
        elif command == "train":
            from data_pipelines.paths import absolute_data_paths
            from dualcse_jax.configs import DATA_FILES

            # Saved with the run: evaluate and resume find the files from any directory.
            workflows.train(absolute_data_paths(FLAGS.config, (*DATA_FILES, "train_shards")),
                            FLAGS.workdir)
        elif command == "preprocess":
            from dualcse_jax import data

            preprocess.run_preprocess("dualcse-jax", data.corpus_source, FLAGS.config,
                                      FLAGS.output, FLAGS.num_shards)
        elif command == "evaluate":
            given = {arg[len("--config."):].split("=", 1)[0] for arg in sys.argv
                     if arg.startswith("--config.")}
            from dualcse_jax.evaluate import parse_rules

            workflows.evaluate_workdir(FLAGS.workdir, step=FLAGS.step, baseline=FLAGS.baseline,
                                       eis_data=FLAGS.eis_data,
                                       rules=parse_rules(FLAGS.rte_score_rules),
                                       overrides={k: FLAGS.config[k] for k in sorted(given)
                                                  if k in FLAGS.config})
        elif command == "export-hf":
            if not FLAGS.output:
                raise app.UsageError("export-hf needs --output=DIR")
            workflows.export_hf_workdir(FLAGS.workdir, FLAGS.output, step=FLAGS.step)
        else:
            if not FLAGS.input or not FLAGS.output:
                raise app.UsageError("export needs --input=FILE and --output=DIR")
            workflows.export_workdir(FLAGS.workdir, FLAGS.input, FLAGS.output,
                                     step=FLAGS.step, normalize=FLAGS.normalize)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
