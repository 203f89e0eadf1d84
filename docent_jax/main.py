"""docent-jax (the help text is generated from :data:`PROGRAM`)."""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

import docent_jax
from data_pipelines import preprocess
from docent_jax.configs import DATA_PATHS, FIELDS
from embedding_core.commands import Program, define_flags, main

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
define_flags(DEFAULT_CONFIG)
flags.DEFINE_bool("baselines", True, "evaluate: also score BoS-MiniLM, BoS-GloVe, TF-IDF.")
flags.DEFINE_enum("task", "ranking", ["ranking", "tags"], "evaluate: zero-shot entity ranking "
                  "or MovieLens tag prediction (config.tag_movielens_dir, config.mapping_path).")
preprocess.define_flags()
flags.adopt_module_key_flags(preprocess)  # --help lists --num_shards with our own flags


def load(inv):
    from docent_jax.workflows import loader

    return loader(inv.workdir, step=inv.step, mesh_model=int(inv.overrides.get("mesh_model", 1)))()


def evaluate(inv):
    from docent_jax.workflows import evaluate_workdir

    overrides = dict(inv.overrides)
    if inv.flags.task == "tags":
        from docent_jax.tags import evaluate_tags_workdir

        return evaluate_tags_workdir(inv.workdir, step=inv.step, overrides=overrides)
    return evaluate_workdir(inv.workdir, step=inv.step, baselines=inv.flags.baselines,
                            mesh_model=int(overrides.pop("mesh_model", 1)),
                            overrides=overrides)


def demo(inv):
    from docent_jax.workflows import run_demo

    return run_demo(inv.workdir, inv.config if inv.flags["config"].present else None,
                    inv.flags.num_train_steps)


PROGRAM = Program(
    prog="docent-jax", summary="train, evaluate and export DocEnt entity embeddings (Dual, Full, "
    "Hybrid; docs/docent.md)",
    fields=FIELDS, default_config=DEFAULT_CONFIG, train=docent_jax.train, data_files=DATA_PATHS,
    load=load, evaluate=evaluate, demo=demo, text_name="query",
    usage={"evaluate": "--workdir=DIR [--task=ranking|tags] [--nobaselines]",
           "export": "--workdir=DIR [--output=OUT_DIR] [--input=QUERIES.txt]",
           "demo": "--workdir=DIR [--num_train_steps=N] [--config=CONFIG.py]"},
    help={
        "train": "trains (or resumes) into DIR; --config.variant=dual|full|hybrid; presets "
                 "docent_jax/configs/{dual,full,hybrid}_{cpu,paper}.py; your entities: "
                 "--config.train_file=DOCS.jsonl [--config.eval_queries_file=Q.jsonl] "
                 "(docs/data.md); Amazon reviews: --config.train_data=amazon "
                 "(docs/docent_tags.md).",
        "evaluate": "--task=ranking: MAP, MRR, recall@1/5/10, NDCG@10 of the held-out queries "
                    "next to BoS-MiniLM, BoS-GloVe and TF-IDF (DIR/eval/ranking.json); "
                    "--config.eval_*=V changes the queries, --config.mesh_model=N splits the "
                    "table. --task=tags: MovieLens tag prediction (DIR/eval/tags.json; "
                    "--config.tag_*=V).",
        "export": "Views: entities (the table; Full: its entity rows) and, with --input, "
                  "queries. Dual/Hybrid compare by cosine, Full by dot (+ entity bias).",
        "export-hf": "Dual and Hybrid: the query encoder f at the root, the table in "
                     "entities/ (rank by cosine); Full is refused.",
        "demo": "trains Dual, Full and Hybrid's CPU presets into DIR/{dual,full,hybrid} "
                "(finished runs skipped), evaluates and exports each; one table with "
                "paired-bootstrap intervals and timings. --config: one run into DIR.",
    },
    extra=[preprocess.command("docent_jax.data", "tokenises CONFIG.py's training sentences once "
                              "into --num_shards shards under --output (with entity_ids.txt, "
                              "entities.json); train with --config.train_shards=DIR "
                              "(docs/data.md, \"Sharded corpora\").", DATA_PATHS)])


def run() -> None:
    main(PROGRAM, sys.modules[__name__])


if __name__ == "__main__":
    run()
