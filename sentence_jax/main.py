"""sentence-jax: the command table (its help is generated from :data:`PROGRAM`)."""

from __future__ import annotations

import sys
from pathlib import Path

import sentence_jax
from embedding_core import commands
from sentence_jax.configs.default import FIELDS

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
commands.define_flags(DEFAULT_CONFIG)


def _evaluate(inv):
    raise ValueError("sentence-jax evaluate scores the files given: --ir=BEIR_DIR, "
                     "--sts=FILE, --pairs=FILE or --triplets=FILE")


def _demo(inv):
    from absl import flags

    from sentence_jax import workflows

    return workflows.run_demo(inv.workdir, inv.config, flags.FLAGS.num_train_steps)


PROGRAM = commands.Program(
    prog="sentence-jax", summary="train any encoder the sentence-transformers way on a mesh: "
    "its data columns, losses, samplers and folders (docs/sentence.md)", fields=FIELDS,
    default_config=DEFAULT_CONFIG, train=sentence_jax.train,
    load=lambda inv: sentence_jax.load(inv.workdir, step=inv.step), evaluate=_evaluate,
    demo=_demo, data_files=("train_files",),
    usage={"train": "--workdir=DIR --config.train_files=FILE[,FILE...] [--config=PRESET] "
                    "[--config.loss=LOSS] [--config.FIELD=VALUE ...]",
           "demo": "--workdir=DIR [--num_train_steps=N]"},
    help={"train": "trains (or resumes) config.model on the files' text columns (anchor, "
                   "positive, negatives...; a label/score column for CoSENTLoss) with "
                   "config.loss; presets by name: --config=default (docs/sentence.md).",
          "export-hf": " The folder is the base model's own (its pooling, Dense and "
                       "Normalize modules) with the trained weights and a model card.",
          "demo": "MultipleNegativesRankingLoss on the shipped SNLI triplets, then the "
                  "sentence-transformers folder in DIR/model."})


def run() -> None:
    commands.main(PROGRAM, sys.modules[__name__])


if __name__ == "__main__":
    run()
