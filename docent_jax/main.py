"""docent-jax: train, evaluate and export DocEnt entity embeddings (Dual, Full, Hybrid).

Usage:
  docent-jax train    --workdir=DIR [--config=CONFIG.py] [--config.FIELD=VALUE ...]
  docent-jax evaluate --workdir=DIR [--task=ranking|tags] [--nobaselines]
  docent-jax export   --workdir=DIR [--output=OUT_DIR] [--input=QUERIES.txt]
  docent-jax export-hf --workdir=DIR --output=OUT_DIR
  docent-jax demo     --workdir=DIR [--num_train_steps=N] [--config=CONFIG.py]
  docent-jax preprocess --config=CONFIG.py --output=DIR [--num_shards=8]

train     trains (or resumes) a DocEnt model into DIR: run_config.json, entity_ids.txt,
          encoder/ (HF config and tokenizer), TensorBoard events, orbax checkpoints.
          CONFIG.py defaults to docent_jax/configs/default.py; --config.variant picks
          the model: dual (RELIC-style dual encoder, the default), full (BERT with one
          input token per entity, masked LM over words and entities) or hybrid (dual
          encoder + entity-conditioned MLM).
          CPU presets on the shipped SQuAD corpus: docent_jax/configs/{dual,full,hybrid}_cpu.py;
          paper scale (BERT-base, Amazon reviews): docent_jax/configs/{dual,full,hybrid}_paper.py.
          --config.softmax (Dual, Hybrid) picks the denominator of P(e | s): in_batch (the
          paper) or full_vocab (every entity of the table, vocabulary-parallel).
          Your reviews: --config.train_data=amazon --config.amazon_paths=A.json.gz[,B.json]
          --config.mapping_path=Reviews2Movielens.csv (see docs/docent_tags.md).
          Your entities: --config.train_file=DOCS.jsonl ({"entity", "text"} a line, local
          or gs://) [--config.eval_queries_file=QUERIES.jsonl] (see docs/data.md).
evaluate  --task=ranking (default): zero-shot entity ranking of the held-out queries (SQuAD:
          questions of held-out paragraphs, entities = articles; Amazon: Reddit queries from
          --config.eval_reddit_path at training; --config.eval_queries_file replaces
          them, also on the evaluate line): MAP, MRR, recall@1/5/10, NDCG@10, next to the
          Bag-of-Sentences (MiniLM, GloVe) and TF-IDF baselines; writes DIR/eval/ranking.json.
          --config.mesh_model=N (evaluate, export) splits the entity table over N devices:
          ranks and exports it shard by shard, never whole on one device or the host.
          --task=tags: MovieLens tag prediction (closed and open vocabulary, fine-tuned, with
          the frozen-probe and tag-text baselines; --config.tag_*=V changes a tag setting
          for this evaluation, e.g. --config.tag_movielens_dir=ml-latest/); writes
          DIR/eval/tags.json. See docs/docent_tags.md.
export    writes OUT_DIR (default DIR/export)/entities/: embeddings.npy float32
          [num_entities, dim] (the entity table; Full: its entity rows), ids.txt (line i =
          entity of row i) and meta.json; with --input (one query per line) also
          OUT_DIR/queries/ (the query vectors, ids.txt = the queries). Raw vectors: Dual and
          Hybrid compare with cosine; Full with the dot product (+ entity bias).
export-hf writes a Dual or Hybrid run's query encoder f for Hugging Face /
          sentence-transformers (SentenceTransformer(OUT_DIR).encode(queries) = f(q), no JAX
          needed) and its entity table to OUT_DIR/entities/ (as export); rank entities by
          cosine. Full is refused: its query vector is no pooled encoder (docs/export.md).
demo      trains Dual, Full and Hybrid with their CPU presets into DIR/{dual,full,hybrid}
          (finished runs are skipped), evaluates each with the baselines, exports; prints
          one table with paired-bootstrap intervals and the timings. --config=CONFIG.py
          runs that one config into DIR instead.
preprocess tokenises the training sentences CONFIG.py describes (to the variant's sentence
          length) once into --num_shards ArrayRecord shards under --output (local or gs://),
          with manifest.json, entity_ids.txt and entities.json (names, queries); train with
          --config.train_shards=DIR: no host loads the corpus, each reads only its shards
          (docs/data.md, "Sharded corpora"). --num_shards: a multiple of the training hosts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags

from embedding_core import preprocess
from embedding_core.cli import define_workdir_flags, parse_command, run_app, user_errors

COMMANDS = ("train", "evaluate", "export", "export-hf", "demo", "preprocess")

define_workdir_flags(str(Path(__file__).parent / "configs" / "default.py"))
flags.DEFINE_string("output", None, "export: output directory (default WORKDIR/export); "
                    "export-hf: the new folder; preprocess: the corpus folder.")
flags.DEFINE_string("input", None, "export: a text file of queries, one a line; their "
                    "vectors f(q) go to OUTPUT/queries/.")
flags.DEFINE_bool("baselines", True, "evaluate: also score BoS-MiniLM, BoS-GloVe, TF-IDF.")
flags.DEFINE_enum("task", "ranking", ["ranking", "tags"], "evaluate: zero-shot entity ranking "
                  "or MovieLens tag prediction (config.tag_movielens_dir, config.mapping_path).")
preprocess.define_flags()
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    command = parse_command(argv, COMMANDS)
    from docent_jax import workflows

    with user_errors("docent-jax", command):
        if command == "train":
            from docent_jax.trainer import train

            train(_absolute_paths(FLAGS.config), FLAGS.workdir)
            print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
        elif command == "evaluate" and FLAGS.task == "tags":
            from docent_jax.tags import evaluate_tags_workdir

            evaluate_tags_workdir(FLAGS.workdir, step=FLAGS.step, overrides=_overrides())
        elif command == "evaluate":
            overrides = _overrides()
            workflows.evaluate_workdir(FLAGS.workdir, step=FLAGS.step,
                                       baselines=FLAGS.baselines,
                                       mesh_model=int(overrides.pop("mesh_model", 1)),
                                       overrides=overrides)
        elif command == "preprocess":
            from docent_jax.data import corpus_source

            preprocess.run_preprocess("docent-jax", corpus_source, _absolute_paths(FLAGS.config),
                                      FLAGS.output, FLAGS.num_shards)
        elif command == "export":
            workflows.export_workdir(FLAGS.workdir, FLAGS.output, input_path=FLAGS.input,
                                     step=FLAGS.step,
                                     mesh_model=int(_overrides().get("mesh_model", 1)))
        elif command == "export-hf":
            if not FLAGS.output:
                raise app.UsageError("export-hf needs --output=DIR")
            workflows.export_hf_workdir(FLAGS.workdir, FLAGS.output, step=FLAGS.step)
        else:
            config = FLAGS.config if FLAGS["config"].present else None
            workflows.run_demo(FLAGS.workdir, config, FLAGS.num_train_steps)


PATH_FIELDS = ("squad_path", "amazon_paths", "mapping_path", "eval_reddit_path",
               "tag_movielens_dir", "train_file", "eval_queries_file", "train_shards")
"""Data paths saved with a run: made absolute at ``train``, so that ``evaluate`` from
another directory finds the same files."""


def _absolute_paths(config):
    from data_pipelines.paths import absolute_data_paths

    return absolute_data_paths(config, PATH_FIELDS)


def _overrides() -> dict:
    """``--config.FIELD=V`` given on an ``evaluate`` line: evaluation-only fields (``eval_*``,
    ``tag_*``) changed for this evaluation (the other fields describe the trained model)."""
    given = {arg[len("--config."):].split("=", 1)[0] for arg in sys.argv
             if arg.startswith("--config.")}
    return {k: FLAGS.config[k] for k in sorted(given) if k in FLAGS.config}


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
