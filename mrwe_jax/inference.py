"""``load(workdir)``: a ConvRR / FCRR run as an Encoder, ``encode(texts, side="question" |
"paragraph")`` as the run embedded its texts; views ``questions``, ``paragraphs``."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from data_pipelines.squad import squad_dev_path
from embedding_core import (
    Encoder,
    SavesFolder,
    View,
    configs,
    encode_in_batches,
    multihost,
    parallel,
)
from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object, write_json
from embedding_core.training import training
from mrwe_jax import data
from mrwe_jax.configs import default
from mrwe_jax.features import cache as word_features
from mrwe_jax.features.cache import FeatureSet
from mrwe_jax.features.sources import IdfTable, WordSource, tokenize_words
from mrwe_jax.model import SiameseRetriever, build_model, init_fn, side_inputs, with_words

FEATURES_FILE = "features.json"
IDF_FILE = "idf.json"  # the run's IdfTable.to_json: a trained model needs no corpus
TOWER_FILE = "tower.safetensors"
SIDES = {"question": "questions", "paragraph": "paragraphs"}  # encode(side=) -> view
EXPORT_SPLITS = ("all", "test")


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The run's saved config on today's fields (``embedding_core.configs.read_config``)."""
    return configs.read_config(workdir, default.FIELDS, prog="mrwe-jax",
                               required=("tower", "sources"), validate=default.validate_config)


def read_recipe(workdir: str | os.PathLike) -> dict[str, Any]:
    """``features.json`` (FileNotFoundError: none; ValueError: not a JSON object)."""
    return read_json_object(storage.as_path(workdir) / FEATURES_FILE,
                            f"is {workdir} a mrwe-jax training workdir?")


def read_idf(workdir: str | os.PathLike,
             config: ml_collections.ConfigDict | None = None) -> IdfTable:
    """The run's ``idf.json`` (older runs: rebuilt, with a warning); FileNotFoundError,
    ValueError."""
    path = storage.as_path(workdir) / IDF_FILE
    if path.is_file():
        return IdfTable.from_json(read_json_object(path), str(path))
    config = read_config(workdir) if config is None else config
    shown = config.squad_path or "(the shipped SQuAD dev set)"
    try:
        if not config.squad_path:
            shown = str(squad_dev_path())
        corpus = data.load_corpus_of(config)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{workdir} has no {IDF_FILE} and its training corpus {shown} is gone; the IDF "
            f"table is rebuilt from that corpus for runs trained before {IDF_FILE} was kept: "
            f"put the file back (or set squad_path in {configs.config_path(workdir)} to where it "
            "is now), or retrain (new runs keep their IDF table in the workdir)") from None
    logging.warning("%s has no %s (trained before runs kept their IDF table): rebuilding it "
                    "from %s; the vectors equal the training ones only if that file is "
                    "unchanged", workdir, IDF_FILE, shown)
    return word_features.word_weight_table(config, corpus.paragraph_texts)


def tower_label(config: ml_collections.ConfigDict, step: int | None) -> str:
    """Row label, e.g. ``"ensemble + ConvRR (step 300)"``."""
    name = {"convrr": "ConvRR", "fcrr": "FCRR"}[config.tower]
    extra = ", question side only" if config.question_only else ""
    return f"ensemble + {name} (step {step}{extra})"


class Retriever(SavesFolder, Encoder):
    """A ConvRR / FCRR tower with its feature recipe; ``split``: its export rows (all, test,
    None)."""

    default_normalize = True  # the tower's outputs are unit rows

    def __init__(self, model: SiameseRetriever, params: Any, config: ml_collections.ConfigDict,
                 features: FeatureSet, *, step: int | None = None, workdir: str = "",
                 split: str | None = None) -> None:
        if split not in (None, *EXPORT_SPLITS):
            raise ValueError(f"split must be one of {EXPORT_SPLITS}, got {split!r}")
        self.model, self.params, self.config, self.features = model, params, config, features
        self.step, self.workdir, self.split = step, workdir, split
        self.default_batch_size = int(config.eval_batch_size)
        self.name = tower_label(config, step)
        similarity = "cosine" if config.distance == "cosine" else "euclidean"
        self.views = tuple(View(view, similarity, encode_kwargs={"side": side}, table=True,
                                meta={"side": view}) for side, view in SIDES.items())
        self._sources: dict[str, WordSource] = {}
        self._corpus: tuple | None = None
        # Most padded word slots per call of the mixture and the tower (data.batch_rows).
        self.max_batch_words: int | None = data.MAX_BATCH_WORDS
        self._forward = {q: jax.jit(self._forward_fn(q)) for q in (True, False)}

    @property
    def dim(self) -> int:
        return self.features.dim

    def _forward_fn(self, is_question: bool):
        model, features = self.model, self.features

        def forward(params, x, mask):
            return model.apply({"params": params}, side_inputs(x, mask, features), is_question,
                               method=SiameseRetriever.encode)

        return forward

    def encode_features(self, features: FeatureSet, side: str,
                        indices: np.ndarray | None = None, *, batch_size: int | None = None,
                        show_progress_bar: bool = False, params: Any = None) -> np.ndarray:
        """``[len(indices), d'']`` float32 unit tower outputs of ``side``'s rows."""
        if list(features.names) != list(self.features.names):
            raise ValueError(f"features of sources {features.names}, the run has "
                             f"{self.features.names}")
        n = len(features.lengths(side))
        indices = np.arange(n) if indices is None else np.asarray(indices, np.int64)
        if len(indices) == 0:
            return np.zeros((0, self.dim), np.float32)
        batch_size = int(batch_size or self.default_batch_size)
        params = self.params if params is None else params
        run = self._forward[side == "questions"]
        words = with_words(self.config)
        lengths = features.lengths(side)[indices]
        # Padded to the longest text: long texts go in batches of fewer rows.
        if words:
            rows_of = np.array([data.batch_rows(data.bucket_width(max(int(n), 1)), batch_size,
                                                self.max_batch_words) for n in lengths])
        else:
            rows_of = np.full(len(indices), batch_size)
        out = np.zeros((len(indices), self.dim), np.float32)
        for rows_per_batch in sorted(set(rows_of.tolist()), reverse=True):
            sel = np.flatnonzero(rows_of == rows_per_batch)
            group = indices[sel]

            def build(rows: np.ndarray, width: int, group=group, size=rows_per_batch):
                x, mask = data.side_arrays(features, side, group[rows], with_words=words,
                                           width=data.bucket_width(width))
                pad = size - len(rows)
                if pad:
                    x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
                    mask = None if mask is None else np.concatenate(
                        [mask, np.zeros((pad,) + mask.shape[1:], mask.dtype)])
                return x, mask

            out[sel] = encode_in_batches(
                lengths[sel], build, lambda batch: run(params, *batch),
                batch_size=rows_per_batch,
                show_progress_bar=show_progress_bar, desc=f"encode {side}")
        return out

    def text_features(self, texts: Sequence[str]) -> FeatureSet:
        """The run's per-source features of new texts (its sources, IDF and mixture)."""
        feats = {}
        for spec in word_features.source_specs(self.config):
            if spec.name not in self._sources:
                self._sources[spec.name] = spec.build()
            feats[spec.name] = word_features.compute_text_features(
                list(texts), self._sources[spec.name], self.features.idf_table,
                mixture=functools.partial(data.mixture, max_batch_words=self.max_batch_words),
                layer_weights=spec.layer_weights,
                layer_aggregate=self.config.layer_aggregate,
                word_aggregate=self.config.word_aggregate)
        return self.features.with_texts(feats)

    query_kwargs = {"side": "question"}
    document_kwargs = {"side": "paragraph"}

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool,
                side: str = "question") -> np.ndarray:
        """``side``: ``"question"`` or ``"paragraph"``; a text with no word: ValueError."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {tuple(SIDES)}, got {side!r}")
        for i, text in enumerate(texts):
            if not tokenize_words(text):
                raise ValueError(f"text {i} has no word to embed: {text!r}")
        return self.encode_features(self.text_features(texts), SIDES[side],
                                    batch_size=batch_size, show_progress_bar=show_progress_bar)

    def _corpus_features(self):
        if self._corpus is None:
            try:
                self._corpus = data.load_data(self.config)
            except FileNotFoundError as err:
                raise FileNotFoundError(
                    f"export writes the questions and paragraphs of {self.workdir}'s training "
                    f"corpus, which cannot be read ({err}); put it back or set squad_path in "
                    f"{configs.config_path(self.workdir)} (load(workdir).encode needs no "
                    "corpus)") from None
        return self._corpus

    def export_meta(self) -> dict[str, Any]:
        meta = {"model": f"mrwe-jax {self.name}", "tower": self.config.tower,
                "sources": list(self.features.names),
                "source_weights": [float(x) for x in self.features.source_weights]}
        if self.split is not None:
            meta.update(split=self.split, corpus=self._corpus_features()[0].source)
        return meta

    def table(self, view: str, normalize: bool):
        """The corpus rows of ``view`` (the tower's unit vectors, whatever ``normalize``)."""
        corpus, features = self._corpus_features()
        test = (self.split or "all") == "test"
        if view == "questions":
            ids = corpus.question_ids
            indices = np.flatnonzero(corpus.test_questions) if test else np.arange(len(ids))
        else:
            ids = corpus.paragraph_ids
            indices = data.pool_indices(corpus, self.config.eval_pool if test else "all")

        def blocks(chunk: int = 2048):
            for s in range(0, len(indices), chunk):
                part = indices[s:s + chunk]
                # Each process encodes a slice of the chunk; process 0 writes.
                yield [ids[i] for i in part], multihost.split_map(
                    lambda a, b, part=part: self.encode_features(features, view, part[a:b]),
                    len(part), what=f"encode {view}")

        return len(indices), blocks()

    def hf_folders(self) -> list:
        raise ValueError(
            "MRWE's towers read word features (GloVe, TF-IDF, contextual layer mixtures), not "
            "tokens, so there is no sentence-transformers folder of them: use `mrwe-jax export "
            "--input=TEXTS.txt` for numpy vectors, or `mrwe-jax export-tower` for a folder "
            "that mrwe_jax.workflows.load_tower_export encodes with")

    def write_tower_files(self, stage) -> None:
        """The export-tower files (:func:`load_tower_export` reads them)."""
        from embedding_core.models import param_files
        from embedding_core.serving import hf_export

        config = self.config
        param_files.save_param_tree(stage / TOWER_FILE, self.params,
                                  {"tower": config.tower, "step": self.step})
        configs.save_config(config, stage)
        write_json(stage / FEATURES_FILE, self.features.recipe())
        write_json(stage / IDF_FILE, self.features.idf_table.to_json())
        write_json(stage / hf_export.INFO_FILE, {
            "model": f"mrwe-jax {self.name}", "tower": config.tower, "step": self.step,
            "workdir": storage.display(self.workdir), "sources": list(self.features.names),
            "dim": self.dim, "normalized": True,
            "similarity": "cosine" if config.distance == "cosine" else "euclidean"})
        (stage / "README.md").write_text(
            f"# {self.name}\n\nExported by `mrwe-jax export-tower`. A text's vector is the "
            "run's multi-resolution features (features.json: word sources, their layer and "
            "source weights; idf.json) through the tower (tower.safetensors, Flax layout).\n"
            "\n```python\nfrom mrwe_jax.workflows import load_tower_export\n\n"
            "model = load_tower_export(\"THIS_FOLDER\")\n"
            "q = model.encode([\"a question\"], side=\"question\")\n```\n",
            encoding="utf-8")


def load(workdir: str | os.PathLike, *, step: int | None = None,
         split: str | None = None) -> Retriever:
    """A checkpoint's params (default latest), a whole copy per process; OSError, ValueError."""
    config = read_config(workdir)
    features = FeatureSet.from_recipe(read_recipe(workdir), read_idf(workdir, config))
    model = build_model(config)
    mesh = parallel.make_mesh(-1, int(config.mesh_model))
    step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model, features, config), mesh,
        step=step, rules=configs.axis_rules(config))
    return Retriever(model, multihost.localize(params), config, features, step=step,
                     workdir=str(workdir), split=split)


def load_tower_export(folder: str | os.PathLike) -> Retriever:
    """An export-tower folder's ``Retriever``; FileNotFoundError, ValueError."""
    import flax.linen as nn
    from flax import traverse_util

    from embedding_core.models.param_files import load_param_tree

    config = read_config(folder)
    features = FeatureSet.from_recipe(read_recipe(folder), read_idf(folder, config))
    model = build_model(config)
    tower_file = storage.local_copy(storage.as_path(folder) / TOWER_FILE)
    params, meta = load_param_tree(tower_file)
    expected = jax.eval_shape(lambda: nn.unbox(init_fn(model, features, config)(jax.random.key(0))))
    want = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(expected).items()}
    got = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(params).items()}
    if want != got:
        raise ValueError(f"{tower_file} does not fit the {config.tower} tower of "
                         f"{configs.config_path(folder)}: file {sorted(got.items())}, config "
                         f"{sorted(want.items())}")
    step = int(meta["step"]) if meta.get("step", "None").isdigit() else None
    return Retriever(model, params, config, features, step=step, workdir=os.fspath(folder))
