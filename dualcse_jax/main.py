"""dualcse-jax: the command table (its help is generated from :data:`PROGRAM`)."""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

import dualcse_jax
from data_pipelines import preprocess
from dualcse_jax.configs import DATA_FILES
from dualcse_jax.configs.default import FIELDS
from embedding_core.commands import Program, define_flags, main

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
define_flags(DEFAULT_CONFIG)
flags.DEFINE_bool("baseline", False,
                  "evaluate: also score the pretrained checkpoint as it is (not trained here).")
flags.DEFINE_string("eis_data", None, "evaluate: ImpScore-format CSV for EIS.")
flags.DEFINE_string("rte_score_rules", None, "evaluate: comma-separated RTE score rules "
                    "(max, explicit, implicit, pair) or 'all', one table each from one "
                    "encoding (default: the run's config.eval_rte_score_rule).")
preprocess.define_flags()
flags.adopt_module_key_flags(preprocess)  # --help lists --num_shards with our own flags
FLAGS = flags.FLAGS


def _evaluate(inv):
    from dualcse_jax import workflows
    from dualcse_jax.evaluate import parse_rules

    return workflows.evaluate_workdir(
        inv.workdir, step=inv.step, baseline=FLAGS.baseline, eis_data=FLAGS.eis_data,
        rules=parse_rules(FLAGS.rte_score_rules), overrides=inv.overrides)


def _demo(inv):
    from dualcse_jax import workflows

    return workflows.run_demo(inv.workdir, FLAGS.num_train_steps,
                              config=inv.config if FLAGS["config"].present else None)


PROGRAM = Program(
    prog="dualcse-jax", summary="train, evaluate and export DualCSE sentence embeddings "
    "(docs/dualcse.md)", fields=FIELDS, default_config=DEFAULT_CONFIG,
    train=dualcse_jax.train, load=lambda inv: dualcse_jax.load(inv.workdir, step=inv.step),
    evaluate=_evaluate, demo=_demo, data_files=(*DATA_FILES, "train_shards"),
    usage={"evaluate": "--workdir=DIR [--baseline] [--eis_data=ImpScore.csv] "
                       "[--rte_score_rules=RULE,...|all] [--config.val_file=V.csv] "
                       "[--config.test_file=T.csv]",
           "demo": "--workdir=DIR [--config=PRESET.py] [--num_train_steps=N]"},
    help={
        "train": "trains (or resumes) into DIR: run_config.json, encoder/, TensorBoard "
                 "events, orbax checkpoints. CONFIG.py: configs/default.py (the paper's), "
                 "configs/cross_cpu.py (the README's CPU preset), bi.py, simcse.py; your "
                 "own data: --config.train_file / val_file / test_file (docs/data.md).",
        "evaluate": "RTE on INLI test (or the run's test_file), threshold tuned on INLI val "
                    "(or val_file); writes DIR/eval/rte.json and eis.json. --baseline adds "
                    "MiniLM off the shelf; EIS on --eis_data, else a proxy from the RTE "
                    "test rows (n/a for SimCSE: one vector); "
                    "--config.val_file / test_file / eval_rte_score_rule apply to this "
                    "evaluation only; --rte_score_rules=all: a table per rule.",
        "export": "Views: explicit/ (r) and implicit/ (u).",
        "export-hf": "Cross: explicit/ and implicit/ (the indicator word is in each "
                     "tokenizer: pass plain sentences); bi: its two towers; simcse: one "
                     "folder, OUT_DIR.",
        "demo": "the README's main job: train DualCSE-Cross from MiniLM on INLI with "
                "configs/cross_cpu.py (or --config), evaluate next to MiniLM off the shelf, "
                "export the INLI test premises' r and u."},
    extra=[preprocess.command("dualcse_jax.data", "tokenises the training rows of CONFIG.py "
                              "once into ArrayRecord shards under --output; train on them with "
                              "--config.train_shards=DIR (docs/data.md, \"Sharded corpora\").")])


def run() -> None:
    main(PROGRAM, sys.modules[__name__])


if __name__ == "__main__":
    run()
