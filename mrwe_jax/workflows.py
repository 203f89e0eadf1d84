"""Train, evaluate, export and the demo as functions (the CLI and notebooks call these).

``docs/mrwe.md`` describes the method and the evaluation protocol.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import ml_collections
import numpy as np
from etils import epath

from data_pipelines.retrieval_corpus import RetrievalCorpus
from data_pipelines.word_features import FeatureSet, parse_list
from embedding_core import multihost, storage
from embedding_core.configs import config_path
from embedding_core.export import ExportFolder
from embedding_core.files import write_json
from mrwe_jax import data, evaluate, inference, trainer

# Fields that fix the corpus, the split and the features: runs compared in one table
# must agree on them.
DATA_FIELDS = ("squad_path", "split", "test_fraction", "split_seed", "skip_invalid",
               "sources", "glove_dir", "contextual_model", "contextual_layers",
               "contextual_layer_weights", "contextual_max_length", "tfidf_dim",
               "tfidf_seed", "layer_aggregate", "source_aggregate", "source_weights",
               "word_aggregate", "word_weights")
EXPORT_SPLITS = ("all", "test")


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs):
    """See ``mrwe_jax.trainer.train``."""
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
    """The recall table of the towers in ``workdirs`` (first: t-SNE) with all baselines.

    Writes ``<first workdir>/eval/recall_<pool>.json`` and ``eval/tsne.png``; prints the
    table. Returns ``{"rows": {label: {k: recall}}, "pool": ..., "tsne": path or None}``.
    """
    configs = [inference.read_config(w) for w in workdirs]
    check_same_data(configs)
    config = configs[0]
    pool = pool or config.eval_pool
    if corpus is None or features is None:
        corpus, features = data.load_data(config)
    towers = [inference.load(w, step=step) for w in workdirs]
    ks = parse_list(config.recall_ks, int)
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
    out_dir = storage.as_path(workdirs[0]) / "eval"
    if not multihost.is_primary():  # every process holds the same rows; process 0 writes
        return {"rows": rows, "pool": pool, "tsne": None}
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
                   split: str = "all", step: int | None = None, chunk: int = 2048
                   ) -> epath.Path:
    """The tower's embeddings as two views: ``output/questions`` and ``output/paragraphs``.

    Each view (``embedding_core.export.export_view``) holds ``embeddings.npy`` (float32
    ``[N, d'']``, unit rows), ``ids.txt`` (SQuAD question ids / ``title#index`` paragraph
    ids) and ``meta.json``; ``split="test"`` keeps the test questions and the
    ``config.eval_pool`` paragraphs only. Rows equal ``load(workdir).encode`` of the texts.
    """
    if split not in EXPORT_SPLITS:
        raise ValueError(f"split must be one of {EXPORT_SPLITS}, got {split!r}")
    folder = ExportFolder(output)  # refuses an --output that is a file, before any work
    tower = inference.load(workdir, step=step)
    config = tower.config
    try:
        corpus, features = data.load_data(config)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"export writes the questions and paragraphs of {workdir}'s training corpus, "
            f"which cannot be read ({err}); put it back or set squad_path in "
            f"{config_path(workdir)} (load(workdir).encode needs no "
            "corpus)") from None
    if split == "all":
        sides = {"questions": np.arange(len(corpus.question_ids)),
                 "paragraphs": np.arange(len(corpus.paragraph_ids))}
    else:
        sides = {"questions": np.flatnonzero(corpus.test_questions),
                 "paragraphs": evaluate.pool_indices(corpus, config.eval_pool)}
    with folder:
        for side, indices in sides.items():
            _export_side(folder, tower, corpus, features, side, indices, config, split, workdir,
                         chunk)
    return storage.as_path(output)


def _export_side(folder, tower, corpus, features, side, indices, config, split, workdir,
                 chunk) -> None:
    """One view (``questions`` or ``paragraphs``) of :func:`export_workdir`."""
    ids = corpus.question_ids if side == "questions" else corpus.paragraph_ids

    def blocks(side=side, indices=indices, ids=ids):
        for s in range(0, len(indices), chunk):
            part = indices[s:s + chunk]
            # Each process encodes a slice of the chunk; process 0 writes (ExportFolder).
            yield [ids[i] for i in part], multihost.split_map(
                lambda a, b, part=part: tower.encode_features(features, side, part[a:b]),
                len(part), what=f"encode {side}")

    meta = {
        "model": f"mrwe-jax {tower.name}", "config": config.to_dict(), "step": tower.step,
        "normalized": True,
        "similarity": "cosine" if config.distance == "cosine" else "euclidean",
        "tower": config.tower, "side": side, "split": split, "corpus": corpus.source,
        "workdir": storage.display(workdir), "sources": features.names,
        "source_weights": [float(x) for x in features.source_weights],
    }
    folder.view(side, blocks(), num_rows=len(indices), dim=features.dim, meta=meta)
    print(f"wrote {len(indices)} x {features.dim} {side} embeddings to "
          f"{folder.output / side}")


TOWER_FILE = "tower.safetensors"


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """Writes the trained tower and its feature recipe as a folder of plain files.

    A ConvRR / FCRR tower reads multi-resolution word features (GloVe, MiniLM layers,
    TF-IDF, ...), not tokens, so there is no transformers or sentence-transformers model to
    write. ``output`` holds ``tower.safetensors`` (the tower's Flax parameters, one tensor
    per leaf named by its path, ``embedding_core.hf_export.save_param_tree``),
    ``run_config.json`` (the run's config), ``features.json`` (sources, widths, ``u``,
    aggregates), ``idf.json`` (the IDF table of the training paragraphs),
    ``export_info.json`` and ``README.md``; :func:`load_tower_export` rebuilds the
    ``Retriever`` from it alone (``docs/export.md``).

    Raises:
      FileExistsError: ``output`` is a file or a non-empty folder (before any work).
      FileNotFoundError, ValueError: not a training workdir, no checkpoint (at ``step``).
    """
    from embedding_core import configs, hf_export

    with hf_export.staged_output(output) as stage:
        tower = inference.load(workdir, step=step)
        config = tower.config
        hf_export.save_param_tree(stage / TOWER_FILE, tower.params,
                                  {"tower": config.tower, "step": tower.step})
        configs.save_config(config, stage)
        write_json(stage / inference.FEATURES_FILE, tower.features.recipe())
        write_json(stage / inference.IDF_FILE, tower.features.idf_table.to_json())
        write_json(stage / hf_export.INFO_FILE, {
            "model": f"mrwe-jax {tower.name}", "tower": config.tower, "step": tower.step,
            "workdir": storage.display(workdir), "sources": list(tower.features.names),
            "dim": tower.dim, "normalized": True,
            "similarity": "cosine" if config.distance == "cosine" else "euclidean"})
        (stage / "README.md").write_text(
            f"# {tower.name}\n\nExported by `mrwe-jax export-hf`. A text's vector is the "
            "run's multi-resolution features (features.json: word sources, their layer and "
            "source weights; idf.json) through the tower (tower.safetensors, Flax layout).\n"
            "\n```python\nfrom mrwe_jax.workflows import load_tower_export\n\n"
            "model = load_tower_export(\"THIS_FOLDER\")\n"
            "q = model.encode([\"a question\"], side=\"question\")\n```\n",
            encoding="utf-8")
    print(f"wrote {storage.display(output)}: {TOWER_FILE}, the run config, features.json, "
          "idf.json")
    return storage.as_path(output)


def load_tower_export(folder: str | os.PathLike) -> inference.Retriever:
    """The ``Retriever`` of an :func:`export_hf_workdir` folder (local or ``gs://``):
    ``encode(texts, side=...)`` equals ``load(workdir).encode`` of the exported run.

    Raises:
      FileNotFoundError: a file of the folder is missing.
      ValueError: ``tower.safetensors`` does not fit the saved config's tower.
    """
    import flax.linen as nn
    import jax
    from flax import traverse_util

    from embedding_core import hf_export
    from mrwe_jax.model import build_model, init_fn

    config = inference.read_config(folder)
    features = FeatureSet.from_recipe(inference.read_recipe(folder),
                                      inference.read_idf(folder, config))
    model = build_model(config)
    tower_file = storage.local_copy(storage.as_path(folder) / TOWER_FILE)
    params, meta = hf_export.load_param_tree(tower_file)
    expected = jax.eval_shape(lambda: nn.unbox(init_fn(model, features, config)(
        jax.random.key(0))))
    want = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(expected).items()}
    got = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(params).items()}
    if want != got:
        raise ValueError(f"{tower_file} does not fit the {config.tower} tower of "
                         f"{config_path(folder)}: file {sorted(got.items())}, config "
                         f"{sorted(want.items())}")
    step = int(meta["step"]) if meta.get("step", "None").isdigit() else None
    return inference.Retriever(model, params, config, features, step=step,
                               workdir=os.fspath(folder))


def run_demo(workdir: str | os.PathLike, *, num_train_steps: int | None = None) -> dict:
    """The shipped run: features, ConvRR and FCRR with the CPU presets, both pools' tables
    and the t-SNE picture; returns :func:`evaluate_workdirs`' result for the test pool."""
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
