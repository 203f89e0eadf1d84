"""``load(workdir)``: a trained ConvRR / FCRR run as an ``embedding_core.inference.Encoder``.

``load(w).encode(texts, side="question"|"paragraph")`` embeds new texts the way the run's
training texts were embedded (``docs/mrwe.md``): the run's word sources, the IDF table of
its corpus's paragraphs (kept in the workdir as ``idf.json``), ``f_mixture`` and
``f_ensemble`` with the run's ``u`` (``features.json``), then the tower. Only the
checkpoint's params are restored (no optimizer); neither the corpus nor its cached
features are needed. :meth:`Retriever.encode_features` encodes already computed features
(the evaluation and the export use the feature cache).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from data_pipelines import word_features
from data_pipelines.squad import squad_dev_path
from data_pipelines.word_features import FeatureSet
from data_pipelines.word_sources import IdfTable, WordSource, tokenize_words
from embedding_core import configs, multihost, parallel, storage, training
from embedding_core.files import read_json_object
from embedding_core.inference import Encoder, encode_in_batches
from mrwe_jax import data
from mrwe_jax.configs import default
from mrwe_jax.model import SiameseRetriever, build_model, init_fn, side_inputs, with_words

FEATURES_FILE = "features.json"
# The run's IDF table (``IdfTable.to_json``): a trained model does not need its corpus.
IDF_FILE = "idf.json"
# encode(side=...) -> the feature side it reads.
SIDES = {"question": "questions", "paragraph": "paragraphs"}


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The run's saved config on today's defaults (``embedding_core.configs.read_config``)."""
    return configs.read_config(workdir, default.get_config, prog="mrwe-jax",
                               required=("tower", "sources"),
                               validate=default.validate_config)


def read_recipe(workdir: str | os.PathLike) -> dict[str, Any]:
    """``features.json``: sources, their widths, the resolved ``u`` and the aggregates.

    Raises:
      FileNotFoundError: the workdir has none; ValueError: not a JSON object.
    """
    return read_json_object(storage.as_path(workdir) / FEATURES_FILE,
                            f"is {workdir} a mrwe-jax training workdir?")


def read_idf(workdir: str | os.PathLike,
             config: ml_collections.ConfigDict | None = None) -> IdfTable:
    """The IDF table the run was trained with: ``idf.json`` of the workdir.

    A workdir trained before runs kept ``idf.json`` gets the table rebuilt from its
    training corpus (``config.squad_path``, or the shipped dev set), with a warning: the
    vectors match the training ones only if that file is unchanged.

    Raises:
      FileNotFoundError: no ``idf.json`` and the corpus file is gone (both are named).
      ValueError: an ``idf.json`` that is not an IDF table.
    """
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


class Retriever(Encoder):
    """A ConvRR / FCRR tower with its feature recipe; ``encode(texts, side=...)``.

    Attributes:
      model, params, config, step: the restored run.
      features: the run's feature recipe (``FeatureSet`` of no texts, or the corpus's).
      name: the row label of evaluation tables.
    """

    def __init__(self, model: SiameseRetriever, params: Any, config: ml_collections.ConfigDict,
                 features: FeatureSet, *, step: int | None = None, workdir: str = "") -> None:
        self.model, self.params, self.config, self.features = model, params, config, features
        self.step, self.workdir = step, workdir
        self.default_batch_size = int(config.eval_batch_size)
        self.name = tower_label(config, step)
        self._sources: dict[str, WordSource] = {}
        # Most padded word slots per call of the mixture and the tower (data.batch_rows).
        self.max_batch_words: int | None = data.MAX_BATCH_WORDS
        self._forward = {q: jax.jit(self._forward_fn(q)) for q in (True, False)}

    @property
    def dim(self) -> int:
        return self.features.dim

    def _forward_fn(self, is_question: bool):
        model, features, config = self.model, self.features, self.config

        def forward(params, arrays):
            return model.apply({"params": params}, side_inputs(arrays, "x_", features, config),
                               is_question, method=SiameseRetriever.encode)

        return forward

    def encode_features(self, features: FeatureSet, side: str,
                        indices: np.ndarray | None = None, *, batch_size: int | None = None,
                        show_progress_bar: bool = False, params: Any = None) -> np.ndarray:
        """Tower outputs of computed features: ``"questions"`` or ``"paragraphs"`` rows.

        Args:
          features: features of the run's recipe (sources, ``u``, aggregates).
          indices: rows of that side (default all), returned in this order.
          params: other params of the same model (the training loop's evaluation).

        Returns:
          ``[len(indices), d'']`` float32 unit vectors (zero for a text with no word when the
          tower is skipped, e.g. paragraphs with ``question_only``).
        """
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
        # ConvRR's batches are padded to their longest text: long texts go in batches of
        # fewer rows (data.batch_rows), so memory is linear in a text's word count.
        if words:
            rows_of = np.array([data.batch_rows(data.bucket_width(max(int(n), 1)), batch_size,
                                                self.max_batch_words) for n in lengths])
        else:
            rows_of = np.full(len(indices), batch_size)
        out = np.zeros((len(indices), self.dim), np.float32)
        for rows_per_batch in sorted(set(rows_of.tolist()), reverse=True):
            sel = np.flatnonzero(rows_of == rows_per_batch)
            group = indices[sel]

            def build(rows: np.ndarray, width: int, group=group, size=rows_per_batch
                      ) -> dict[str, np.ndarray]:
                arrays = data.side_arrays(features, side, group[rows], with_words=words,
                                          width=data.bucket_width(width), prefix="x_")
                pad = size - len(rows)
                return {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                        for k, v in arrays.items()} if pad else arrays

            out[sel] = encode_in_batches(
                lengths[sel], build, lambda arrays: run(params, arrays),
                batch_size=rows_per_batch, pad_multiple=16,
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

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool,
                side: str = "question") -> np.ndarray:
        """See ``Encoder.encode``; ``side="question"`` or ``"paragraph"`` (they differ only
        with ``question_only``). A text with no word (e.g. ``"?!"``) raises ``ValueError``
        like an empty one: it has nothing to embed."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {tuple(SIDES)}, got {side!r}")
        for i, text in enumerate(texts):
            if not tokenize_words(text):
                raise ValueError(f"text {i} has no word to embed: {text!r}")
        return self.encode_features(self.text_features(texts), SIDES[side],
                                    batch_size=batch_size, show_progress_bar=show_progress_bar)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> Retriever:
    """Restores the params of a training workdir's checkpoint (default: the latest).

    The params are placed on a mesh of all devices (``config.mesh_model`` wide); nothing of
    the optimizer is read. Each process keeps its own whole copy
    (``embedding_core.multihost.localize``; ``mesh_model`` must not span hosts).

    The IDF table is the run's ``idf.json`` (:func:`read_idf`): the training corpus is
    not read (except for a workdir trained before runs kept it).

    Raises:
      FileNotFoundError: not a mrwe-jax workdir, or no checkpoint (at ``step``); an old
        workdir without ``idf.json`` whose corpus file is gone.
      ValueError: a bad saved config, feature recipe or IDF table.
    """
    config = read_config(workdir)
    recipe = read_recipe(workdir)
    features = FeatureSet.from_recipe(recipe, read_idf(workdir, config))
    model = build_model(config)
    mesh = parallel.make_mesh(-1, int(config.mesh_model))
    step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model, features, config), mesh,
        step=step,
        rules=configs.axis_rules(config))
    return Retriever(model, multihost.localize(params), config, features, step=step,
                     workdir=str(workdir))
