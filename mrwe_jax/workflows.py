"""Train, evaluate, export and the demo as functions (``docs/mrwe.md``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import ml_collections
from etils import epath

from data_pipelines.retrieval_corpus import RetrievalCorpus
from embedding_core import multihost, write_json
from embedding_core.serving import serving
from embedding_core.storage import storage
from mrwe_jax import data, evaluate, inference, trainer
from mrwe_jax.features.cache import FeatureSet, parse_list
from mrwe_jax.inference import TOWER_FILE, load_tower_export  # noqa: F401 (export-hf's)

# Fields that fix the corpus, the split and the features: runs compared in one table
# must agree on them.
DATA_FIELDS = ("squad_path", "train_file", "split", "test_fraction", "split_seed", "skip_invalid",
               "sources", "glove_dir", "contextual_model", "contextual_layers",
               "contextual_layer_weights", "contextual_max_length", "tfidf_dim",
               "tfidf_seed", "layer_aggregate", "source_aggregate", "source_weights",
               "word_aggregate", "word_weights")


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs):
    return trainer.train(config, workdir, **kwargs)


def check_same_data(configs: Sequence[ml_collections.ConfigDict]) -> None:
    """Raises ValueError when runs to be compared were trained on different data/features."""
    first = configs[0]
    for other in configs[1:]:
        diff = [f for f in DATA_FIELDS if first.get(f) != other.get(f)]
        if diff:
            raise ValueError(f"runs differ in data/feature settings {diff}; one table needs "
                             "the same corpus, split and features")


def evaluate_workdirs(workdirs: Sequence[str | os.PathLike], *, pool: str | None = None,
                      step: int | None = None, tsne: bool = True, progress: bool = True,
                      title_suffix: str = "", corpus: RetrievalCorpus | None = None,
                      features: FeatureSet | None = None) -> dict:
    """The recall table of ``workdirs``' towers with the baselines; writes
    ``eval/recall_<pool>.json``, ``eval/tsne.png`` in the first; ``{"rows", "pool", "tsne"}``."""
    configs = [inference.read_config(w) for w in workdirs]
    check_same_data(configs)
    config = configs[0]
    pool = pool or config.eval_pool
    if corpus is None or features is None:
        corpus, features = data.load_data(config)
    towers = [inference.load(w, step=step) for w in workdirs]
    ks = parse_list(config.recall_ks, int)
    variants = [v for v in ("uniform", "balanced") if v != (config.source_weights or "uniform")]
    rows = evaluate.evaluate_retrieval(corpus, features, towers, pool=pool, ks=ks,
                                       ensemble_variants=variants, progress=progress)
    n_pool = len(data.pool_indices(corpus, pool))
    pool_words = ("all paragraphs of the test articles" if pool == "test"
                  and corpus.split == "articles" else "all paragraphs of the corpus")
    title = (f"recall@k (%) of the right paragraph, {int(corpus.test_questions.sum())} test "
             f"questions ({corpus.split} split), pool = {pool_words} ({n_pool}){title_suffix}")
    out_dir = storage.as_path(workdirs[0]) / "eval"
    if not multihost.is_primary():  # every process holds the same rows; process 0 writes
        return {"rows": rows, "pool": pool, "tsne": None}
    print()
    print(evaluate.format_table(rows, title))
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
                   split: str = "all", step: int | None = None) -> epath.Path:
    """``mrwe-jax export``: ``output/questions``, ``output/paragraphs`` (or the test rows)."""
    if split not in inference.EXPORT_SPLITS:
        raise ValueError(f"split must be one of {inference.EXPORT_SPLITS}, got {split!r}")
    return serving.export(lambda: inference.load(workdir, step=step, split=split), output,
                          workdir=workdir)


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """``mrwe-jax export-hf``: refused in one line; nothing is written."""
    return serving.export_hf(lambda: inference.load(workdir, step=step), output, workdir=workdir)


def export_tower_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                         step: int | None = None) -> epath.Path:
    """``mrwe-jax export-tower``: tower and recipe as plain files in a new or empty ``output``;
    FileExistsError otherwise."""
    from embedding_core.serving import hf_export

    with hf_export.staged_output(output) as stage:
        inference.load(workdir, step=step).write_tower_files(stage)
    if multihost.is_primary():
        print(f"wrote {storage.display(output)}: tower.safetensors, features.json, idf.json "
              "(mrwe_jax.workflows.load_tower_export)")
    return storage.as_path(output)


def run_demo(workdir: str | os.PathLike, *, num_train_steps: int | None = None) -> dict:
    """The shipped run: features, ConvRR, FCRR, tables, t-SNE (the test pool's result)."""
    from mrwe_jax.configs import convrr_cpu, fcrr_cpu

    workdir = storage.as_path(workdir)
    t0 = time.time()
    conv_config, fc_config = convrr_cpu.get_config(), fcrr_cpu.get_config()
    if num_train_steps:
        for c in (conv_config, fc_config):
            c.num_train_steps = int(num_train_steps)
    print("[1/4] multi-resolution features of SQuAD dev (GloVe, MiniLM hidden states, "
          "hashed TF-IDF; cached after the first run)")
    corpus, features = data.load_data(conv_config)
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
    result = evaluate_workdirs(runs, pool="test", corpus=corpus, features=features, progress=False)
    # The paper ranks among all paragraphs: here the training articles' paragraphs join the
    # pool as distractors (never as answers: test questions ask about test paragraphs).
    evaluate_workdirs(runs, pool="all", tsne=False, corpus=corpus, features=features,
                      progress=False)
    t4 = time.time()
    print(f"\ntime: features {t1 - t0:.0f}s, ConvRR {t2 - t1:.0f}s, FCRR {t3 - t2:.0f}s, "
          f"evaluation {t4 - t3:.0f}s, total {t4 - t0:.0f}s")
    print(f"checkpoints and TensorBoard events: {workdir / 'convrr'}, {workdir / 'fcrr'}")
    return result
