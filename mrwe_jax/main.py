"""mrwe-jax: multi-resolution word embeddings + ConvRR/FCRR retrieval on SQuAD.

Usage:
  mrwe-jax train    --config=CONFIG.py --workdir=DIR [--config.FIELD=VALUE ...]
  mrwe-jax evaluate --workdir=DIR [--also=DIR2,...] [--pool=test|all]
  mrwe-jax export   --workdir=DIR --output=OUT_DIR [--export_split=all|test]
  mrwe-jax demo     --workdir=DIR [--num_train_steps=N]

train     builds (or reads from the cache) the multi-resolution features of SQuAD, then
          trains the configured tower (ConvRR or FCRR) with the batch-hard triplet loss on
          the training questions into DIR: config.json, features.json, TensorBoard events,
          orbax checkpoints. CONFIG.py defaults to mrwe_jax/configs/default.py (the papers'
          settings); configs/convrr_cpu.py and configs/fcrr_cpu.py are the CPU presets.
evaluate  recall@{1,2,3,5,10,20,50} of the right paragraph for every test question over
          the pool (default: config.eval_pool; "test" = all paragraphs of the test
          articles, "all" = every paragraph): TF-IDF, BM25, each single source, the
          ensemble and the trained tower(s) of DIR (and --also) in one table; writes
          DIR/eval/recall_<pool>.json and the t-SNE picture DIR/eval/tsne.png.
export    question and paragraph embeddings of the trained tower: OUT_DIR/questions and
          OUT_DIR/paragraphs, each embedding.npy (float32 [N, d''], unit rows), ids.txt
          (SQuAD question ids / "title#index" paragraph ids) and meta.json.
demo      the shipped run: features, ConvRR and FCRR with the CPU presets on the training
          articles of SQuAD dev, the tables for both pools and the t-SNE picture
          (DIR/convrr, DIR/fcrr).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from absl import app, flags, logging

from embedding_core.cli import define_workdir_flags, parse_command, run_app, user_errors
from embedding_core.export import write_json

_DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
COMMANDS = ("train", "evaluate", "export", "demo")
# Fields that fix the corpus, the split and the features: runs compared in one table
# must agree on them.
DATA_FIELDS = ("squad_path", "split", "test_fraction", "split_seed", "skip_invalid",
               "sources", "glove_dir", "contextual_model", "contextual_layers",
               "contextual_layer_weights", "contextual_max_length", "tfidf_dim",
               "tfidf_seed", "layer_aggregate", "source_aggregate", "source_weights",
               "word_aggregate")

define_workdir_flags(_DEFAULT_CONFIG, "Training directory (demo: its parent of runs).")
flags.DEFINE_list("also", [], "evaluate: more workdirs whose towers join the table.")
flags.DEFINE_enum("pool", None, ["test", "all"], "evaluate: retrieval pool "
                  "(default: the workdir's config.eval_pool).")
flags.DEFINE_string("output", None, "export: output directory.")
flags.DEFINE_enum("export_split", "all", ["all", "test"],
                  "export: every question and paragraph, or the test questions and pool.")
FLAGS = flags.FLAGS


def check_same_data(configs) -> None:
    """Raises ValueError when runs to be compared were trained on different data/features."""
    first = configs[0]
    for other in configs[1:]:
        diff = [f for f in DATA_FIELDS if first.get(f) != other.get(f)]
        if diff:
            raise ValueError(f"runs differ in data/feature settings {diff}; one table needs "
                             "the same corpus, split and features")


def evaluate_workdirs(workdirs, *, pool: str | None = None, step: int | None = None,
                      tsne: bool = True, progress: bool = True, title_suffix: str = "",
                      corpus=None, features=None) -> dict:
    """The recall table of the towers in ``workdirs`` (first: t-SNE) with all baselines.

    Writes ``<first workdir>/eval/recall_<pool>.json`` and ``eval/tsne.png``; prints the
    table. Returns ``{"rows": {label: {k: recall}}, "pool": ..., "tsne": path or None}``.
    """
    from mrwe_jax import data, evaluate, trainer

    configs = [trainer.read_config(w) for w in workdirs]
    check_same_data(configs)
    config = configs[0]
    pool = pool or config.eval_pool
    if corpus is None or features is None:
        corpus, features = trainer.load_data(config)
    towers = [evaluate.load_tower(w, features, step=step) for w in workdirs]
    ks = data.parse_list(config.recall_ks, int)
    variants = [v for v in ("uniform", "balanced")
                if v != (config.source_weights or "uniform")]
    rows = evaluate.evaluate_retrieval(corpus, features, towers, pool=pool, ks=ks,
                                       ensemble_variants=variants, progress=progress)
    n_pool = len(evaluate.pool_indices(corpus, pool))
    pool_words = ("all paragraphs of the test articles" if pool == "test"
                  and corpus.split == "articles" else "all paragraphs of the corpus")
    title = (f"recall@k (%) of the right paragraph, {int(corpus.test_questions.sum())} test "
             f"questions ({corpus.split} split), pool = {pool_words} ({n_pool}){title_suffix}")
    print()
    print(evaluate.format_table(rows, title))
    out_dir = Path(workdirs[0]) / "eval"
    write_json(out_dir / f"recall_{pool}.json", {
        "pool": pool, "pool_size": n_pool, "split": corpus.split,
        "num_test_questions": int(corpus.test_questions.sum()),
        "rows": {k: {str(kk): v for kk, v in r.items()} for k, r in rows.items()},
        "source_weights": dict(zip(features.names, map(float, features.source_weights),
                                   strict=True)),
    })
    png = None
    if tsne:
        png = evaluate.tsne_before_after(corpus, features, towers[0], out_dir / "tsne.png",
                                         num_paragraphs=int(config.tsne_paragraphs))
        print(f"t-SNE picture: {png}")
    print(f"recall table: {out_dir / f'recall_{pool}.json'}")
    return {"rows": rows, "pool": pool, "tsne": png}


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                   split: str = "all", step: int | None = None, chunk: int = 2048) -> Path:
    """Streams the tower's question and paragraph embeddings into ``output`` atomically."""
    import numpy as np

    from embedding_core.export import export_embeddings
    from mrwe_jax import evaluate, trainer

    config = trainer.read_config(workdir)
    corpus, features = trainer.load_data(config)
    tower = evaluate.load_tower(workdir, features, step=step)
    if split == "all":
        sides = {"questions": np.arange(len(corpus.question_ids)),
                 "paragraphs": np.arange(len(corpus.paragraph_ids))}
    else:
        sides = {"questions": np.flatnonzero(corpus.test_questions),
                 "paragraphs": evaluate.pool_indices(corpus, config.eval_pool)}
    output = Path(output)
    for side, indices in sides.items():
        ids = corpus.question_ids if side == "questions" else corpus.paragraph_ids

        def blocks(side=side, indices=indices, ids=ids):
            for s in range(0, len(indices), chunk):
                part = indices[s:s + chunk]
                yield [ids[i] for i in part], {"embedding": tower.encode(features, side, part)}

        meta = {
            "model": tower.name, "tower": config.tower, "checkpoint_step": tower.step,
            "side": side, "split": split, "corpus": corpus.source,
            "workdir": str(Path(workdir).resolve()), "normalisation": "l2 (unit rows)",
            "similarity": "cosine = dot product", "sources": features.names,
            "source_weights": [float(x) for x in features.source_weights],
            "config": config.to_dict(),
        }
        export_embeddings(output / side, blocks(), num_rows=len(indices),
                          dims={"embedding": features.dim}, meta=meta)
        print(f"wrote {len(indices)} x {features.dim} {side} embeddings to {output / side}")
    return output


def run_demo(workdir: str | os.PathLike, *, num_train_steps: int | None = None) -> dict:
    """The shipped run (see the module docstring); returns ``evaluate_workdirs``' result."""
    from mrwe_jax import trainer
    from mrwe_jax.configs import convrr_cpu, fcrr_cpu

    workdir = Path(workdir)
    t0 = time.time()
    conv_config, fc_config = convrr_cpu.get_config(), fcrr_cpu.get_config()
    if num_train_steps:
        for c in (conv_config, fc_config):
            c.num_train_steps = int(num_train_steps)
    print("[1/4] multi-resolution features of SQuAD dev (GloVe, MiniLM hidden states, "
          "hashed TF-IDF; cached after the first run)")
    corpus, features = trainer.load_data(conv_config)
    print(f"      {corpus.summary()}")
    t1 = time.time()
    print(f"[2/4] training ConvRR ({conv_config.num_train_steps} steps, P="
          f"{conv_config.paragraphs_per_batch} x K={conv_config.questions_per_paragraph}) "
          f"-> {workdir / 'convrr'}")
    trainer.train(conv_config, workdir / "convrr", corpus=corpus, features=features)
    t2 = time.time()
    print(f"[3/4] training FCRR ({fc_config.num_train_steps} steps) -> {workdir / 'fcrr'}")
    trainer.train(fc_config, workdir / "fcrr", corpus=corpus, features=features)
    t3 = time.time()
    print("[4/4] evaluating")
    runs = [workdir / "convrr", workdir / "fcrr"]
    result = evaluate_workdirs(runs, pool="test", corpus=corpus, features=features,
                               progress=False)
    # The paper ranks among all paragraphs: here the training articles' paragraphs join the
    # pool as distractors (never as answers: test questions ask about test paragraphs).
    evaluate_workdirs(runs, pool="all", tsne=False, corpus=corpus, features=features,
                      progress=False)
    t4 = time.time()
    print(f"\ntime: features {t1 - t0:.0f}s, ConvRR {t2 - t1:.0f}s, FCRR {t3 - t2:.0f}s, "
          f"evaluation {t4 - t3:.0f}s, total {t4 - t0:.0f}s")
    print(f"checkpoints and TensorBoard events: {workdir / 'convrr'}, {workdir / 'fcrr'}")
    return result


def main(argv: list[str]) -> None:
    command = parse_command(argv, COMMANDS)
    with user_errors("mrwe-jax", command):
        if command == "train":
            from mrwe_jax.trainer import train

            train(FLAGS.config, FLAGS.workdir)
            print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
        elif command == "evaluate":
            evaluate_workdirs([FLAGS.workdir, *FLAGS.also], pool=FLAGS.pool, step=FLAGS.step)
        elif command == "export":
            if not FLAGS.output:
                raise app.UsageError("export needs --output=DIR")
            export_workdir(FLAGS.workdir, FLAGS.output, split=FLAGS.export_split, step=FLAGS.step)
        else:
            logging.set_verbosity(logging.WARNING)  # the demo prints its own progress
            run_demo(FLAGS.workdir, num_train_steps=FLAGS.num_train_steps)


def run() -> None:
    """Console-script entry point."""
    run_app(main, sys.modules[__name__])


if __name__ == "__main__":
    run()
