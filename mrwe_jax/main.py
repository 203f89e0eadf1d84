"""mrwe-jax: the command table (its help is generated from :data:`PROGRAM`)."""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags, logging

import mrwe_jax
from embedding_core.commands import Command, Program, define_flags, main
from mrwe_jax.configs.default import FIELDS

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
define_flags(DEFAULT_CONFIG)
flags.DEFINE_list("also", [], "evaluate: more workdirs whose towers join the table.")
flags.DEFINE_enum("pool", None, ["test", "all"], "evaluate: retrieval pool "
                  "(default: the workdir's config.eval_pool).")
flags.DEFINE_enum("export_split", "all", ["all", "test"],
                  "export: every question and paragraph, or the test questions and pool.")
FLAGS = flags.FLAGS


def _evaluate(inv):
    from mrwe_jax import workflows

    return workflows.evaluate_workdirs([inv.workdir, *FLAGS.also], pool=FLAGS.pool, step=inv.step)


def _demo(inv):
    from mrwe_jax import workflows

    logging.set_verbosity(logging.WARNING)  # the demo prints its own progress
    return workflows.run_demo(inv.workdir, num_train_steps=FLAGS.num_train_steps)


def _load(inv):
    # --input: the texts' vectors; else the corpus rows of --export_split.
    return mrwe_jax.load(inv.workdir, step=inv.step,
                         split=None if FLAGS.input else FLAGS.export_split)


def _export_tower(inv):
    from mrwe_jax import workflows

    if not FLAGS.output:
        raise ValueError("export-tower needs --output=DIR (a new or empty folder)")
    return workflows.export_tower_workdir(inv.workdir, FLAGS.output, step=inv.step)


PROGRAM = Program(
    prog="mrwe-jax", summary="multi-resolution word embeddings + ConvRR/FCRR retrieval on "
    "SQuAD (docs/mrwe.md)", fields=FIELDS, default_config=DEFAULT_CONFIG,
    train=mrwe_jax.train, load=_load, evaluate=_evaluate, demo=_demo,
    data_files=("squad_path", "train_file"),
    extra=[Command("export-tower", _export_tower, "--workdir=DIR --output=OUT_DIR",
                   "writes the tower and its feature recipe into a new or empty OUT_DIR: "
                   "tower.safetensors, run_config.json, features.json, idf.json; "
                   "mrwe_jax.workflows.load_tower_export(OUT_DIR) encodes with it alone "
                   "(no checkpoint, no corpus).")],
    usage={"evaluate": "--workdir=DIR [--also=DIR2,...] [--pool=test|all]",
           "export": "--workdir=DIR --output=OUT_DIR [--export_split=all|test] "
                     "[--input=TEXTS.txt]"},
    help={
        "train": "builds (or reads from the cache) the multi-resolution features of SQuAD, "
                 "then trains the configured tower (ConvRR or FCRR) with the batch-hard "
                 "triplet loss into DIR: run_config.json, features.json, idf.json, "
                 "TensorBoard events, orbax checkpoints. CONFIG.py: configs/default.py (the "
                 "papers'), convrr_cpu.py, fcrr_cpu.py; your own data: "
                 "--config.squad_path=FILE, or --config.train_file=PAIRS.jsonl of "
                 "{question, passage} (docs/data.md).",
        "evaluate": "recall@{1,2,3,5,10,20,50} of the right paragraph for every test "
                    "question over the pool (default config.eval_pool): TF-IDF, BM25, each "
                    "source, the ensemble and the towers of DIR (and --also) in one table; "
                    "writes DIR/eval/recall_<pool>.json and DIR/eval/tsne.png.",
        "export": "Views: questions/ and paragraphs/ (SQuAD question ids / \"title#index\" "
                  "paragraph ids, unit rows): every row, or with --export_split=test the "
                  "test questions and the pool; --input: those texts on both sides.",
        "export-hf": "refused: a tower reads word features, not tokens, so there is no "
                     "sentence-transformers form; use export (numpy) or export-tower.",
        "demo": "the shipped run: features, ConvRR and FCRR with the CPU presets on SQuAD "
                "dev, the tables for both pools and the t-SNE picture (DIR/convrr, "
                "DIR/fcrr)."})


def run() -> None:
    main(PROGRAM, sys.modules[__name__])


if __name__ == "__main__":
    run()
