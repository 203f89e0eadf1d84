"""Cached per-source word features of a retrieval corpus (``docs/mrwe.md``).

For each configured source (``data_pipelines.word_sources``: GloVe, MiniLM hidden states,
hashed TF-IDF) and each text of a corpus, the IDF-weighted layer mixture ``x_i^j`` of every
word and the pooled text vector, computed once and cached on disk under
``data_pipelines.paths.cache_dir()/mrwe_features/<sha256 of the inputs>/``. The mixture
itself is the model's equation: callers pass it in as a :data:`Mixture`
(``mrwe_jax.data.mixture``), so this layer imports no model code. The ensemble over sources
(``f_ensemble``) is *not* cached: the model applies it on the fly, so the source weights
``u`` can change without recomputing anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from data_pipelines.paths import cache_dir
from data_pipelines.retrieval_corpus import RetrievalCorpus
from data_pipelines.word_sources import (
    ContextualSource,
    GloveSource,
    HashedTfidfSource,
    IdfTable,
    WordSource,
    idf,
    tokenize_words,
)
from embedding_core.glove import glove_files

SOURCE_KINDS = ("glove", "contextual", "tfidf")
FEATURE_CACHE_VERSION = "mrwe_features v1"


class Mixture(Protocol):
    """``f_mixture`` with fixed coefficients and word pooling, one source at a time.

    ``mixture(texts, source, idf_table, layer_weights=..., layer_aggregate=...,
    word_aggregate=..., batch_size=...) -> (word_matrices, vectors)``: one
    ``[num_words_i, d_j]`` float32 matrix per text (rows in :func:`tokenize_words` order) and
    the ``[n, d_j]`` float32 pooled text vectors. The model package supplies it
    (``mrwe_jax.data.mixture``).
    """

    def __call__(self, texts: Sequence[str], source: WordSource, idf_table: IdfTable, *,
                 layer_weights: Sequence[float] | None, layer_aggregate: str,
                 word_aggregate: str, batch_size: int
                 ) -> tuple[list[np.ndarray], np.ndarray]: ...


def normalized_weights(weights: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """Non-negative weights scaled to sum to 1 (the paper's constraint on m and u).

    For ``u`` the paper writes ``sum_j u_j / ||u|| = 1``, which no vector with two non-zero
    entries satisfies for the 2-norm; our reading is the 1-norm, i.e. ``u`` sums to 1
    (``docs/mrwe.md``).

    Raises:
      ValueError: a negative entry or a zero sum (``what`` names the coefficient).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"{what} must be non-negative with a positive sum, got {list(w)}")
    return (w / w.sum()).astype(np.float32)


# --------------------------------------------------------------------------- sources

@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One embedding model as configured, buildable on demand (MiniLM only when needed).

    Attributes:
      name: ``"glove"``, ``"contextual"`` or ``"tfidf"`` (the kind; also the batch key).
      num_layers: L_j, layers the source yields per word.
      layer_weights: ``m^j`` (normalised to sum 1).
      fingerprint: everything that changes the source's output, for the cache key.
      build: ``() -> WordSource``.
    """

    name: str
    num_layers: int
    layer_weights: tuple[float, ...]
    fingerprint: str
    build: Callable[[], WordSource]


def _file_fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def parse_list(value: str | Sequence[Any], kind: type = str) -> list[Any]:
    """``"a, b"`` or a sequence -> ``[kind(a), kind(b)]`` (config fields are flat strings)."""
    if isinstance(value, str):
        parts = [v.strip() for v in value.split(",") if v.strip()]
    else:
        parts = list(value)
    return [kind(v) for v in parts]


def _layer_weights(value: str, count: int, name: str) -> tuple[float, ...]:
    weights = parse_list(value, float) if value else [1.0] * count
    if len(weights) != count:
        raise ValueError(f"{name}: {len(weights)} layer weights for {count} layers")
    return tuple(float(w) for w in normalized_weights(weights, name))


def source_specs(config: Any) -> list[SourceSpec]:
    """The sources named by ``config.sources`` (comma-separated, in ensemble order).

    Config fields used: ``sources``, ``glove_dir``, ``contextual_model``,
    ``contextual_layers``, ``contextual_layer_weights``, ``contextual_max_length``,
    ``contextual_batch_size``, ``tfidf_dim``, ``tfidf_seed`` (see ``configs/default.py``).

    Raises:
      ValueError: an unknown or repeated source, bad layer weights.
      FileNotFoundError: GloVe or the contextual model is not installed (nothing downloads).
    """
    names = parse_list(config.sources)
    if not names:
        raise ValueError("config.sources names no source; use e.g. 'glove,contextual,tfidf'")
    for n in names:
        if n not in SOURCE_KINDS:
            raise ValueError(f"config.sources: unknown source {n!r}; use {SOURCE_KINDS}")
    if len(set(names)) != len(names):
        raise ValueError(f"config.sources repeats a source: {names}")
    specs = []
    for name in names:
        if name == "glove":
            files = glove_files(config.glove_dir or None)
            folder = files[0].parent
            fp = "glove|" + "|".join(_file_fingerprint(f) for f in files)
            specs.append(SourceSpec("glove", 1, (1.0,), fp,
                                    lambda folder=folder: GloveSource(folder)))
        elif name == "tfidf":
            dim, seed = int(config.tfidf_dim), int(config.tfidf_seed)
            specs.append(SourceSpec("tfidf", 1, (1.0,), f"tfidf|dim={dim}|seed={seed}",
                                    lambda dim=dim, seed=seed: HashedTfidfSource(dim, seed)))
        else:
            from embedding_core.pretrained import resolve_model_dir

            model_dir = resolve_model_dir(config.contextual_model)
            layers = tuple(parse_list(config.contextual_layers, int))
            weights = _layer_weights(config.contextual_layer_weights, len(layers),
                                     "config.contextual_layer_weights")
            max_length = int(config.contextual_max_length) or None
            files = sorted(p for p in Path(model_dir).iterdir()
                           if p.is_file() and p.suffix in (".json", ".safetensors", ".txt"))
            fp = (f"contextual|layers={layers}|max_length={max_length}|"
                  + "|".join(_file_fingerprint(f) for f in files))
            batch = int(config.contextual_batch_size)
            specs.append(SourceSpec(
                "contextual", len(layers), weights, fp,
                lambda d=model_dir, la=layers, ml=max_length, b=batch:
                    ContextualSource.from_pretrained(d, layers=la, max_length=ml,
                                                        batch_size=b)))
    return specs



# --------------------------------------------------------------------------- features


@dataclasses.dataclass
class TextFeatures:
    """One source's mixture word vectors for n texts, stored flat.

    Attributes:
      words: ``[total_words, d_j]`` float32; text i's word matrix is
        ``words[offsets[i]:offsets[i + 1]]`` (rows ``x_i^j`` of the paper: IDF-weighted
        layer mixture of each word).
      offsets: ``[n + 1]`` int64, ``offsets[0] = 0``.
      vectors: ``[n, d_j]`` float32 pooled text vectors (zero for a text with no word).
    """

    words: np.ndarray
    offsets: np.ndarray
    vectors: np.ndarray

    @property
    def dim(self) -> int:
        """d_j, the width of the source's word vectors."""
        return int(self.vectors.shape[1])

    @property
    def lengths(self) -> np.ndarray:
        """``[n]`` int64 number of words per text."""
        return np.diff(self.offsets)

    def padded(self, indices: np.ndarray, width: int) -> np.ndarray:
        """``[len(indices), width, d_j]`` float32 word matrices, zero-padded or cut to width."""
        out = np.zeros((len(indices), width, self.dim), np.float32)
        for r, i in enumerate(indices):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            end = min(end, start + width)
            out[r, : end - start] = self.words[start:end]
        return out


@dataclasses.dataclass
class FeatureSet:
    """Per-source features of the questions and the paragraphs of a corpus.

    Attributes:
      names: source names in ensemble order.
      questions, paragraphs: ``{name: TextFeatures}``.
      source_weights: ``[n_sources]`` float32 ``u`` (sums to 1).
      source_aggregate: ``f_ensemble`` (``"concatenate"``, ``"sum"``, ``"average"``).
      word_aggregate: word pooling (``"average"`` or ``"sum"``).
      idf_table: the IDF used (words -> ln(N/df)), for embedding new texts.
    """

    names: list[str]
    questions: dict[str, TextFeatures]
    paragraphs: dict[str, TextFeatures]
    source_weights: np.ndarray
    source_aggregate: str
    word_aggregate: str
    idf_table: IdfTable

    def side(self, side: str) -> dict[str, TextFeatures]:
        """``{name: TextFeatures}`` of ``"questions"`` or ``"paragraphs"`` (else ValueError)."""
        if side not in ("questions", "paragraphs"):
            raise ValueError(f"side must be 'questions' or 'paragraphs', got {side!r}")
        return self.questions if side == "questions" else self.paragraphs

    @property
    def dim(self) -> int:
        """d'', the width of the ensemble."""
        widths = [self.questions[n].dim for n in self.names]
        return sum(widths) if self.source_aggregate == "concatenate" else widths[0]

    def lengths(self, side: str) -> np.ndarray:
        """``[n]`` int64 words per text of one side."""
        return self.side(side)[self.names[0]].lengths

    def recipe(self) -> dict[str, Any]:
        """What a trained run needs to embed new texts, besides the IDF table (JSON).

        ``{"sources", "source_dims", "source_weights", "source_aggregate",
        "word_aggregate", "dim"}``: a run keeps it as ``features.json``.
        """
        return {
            "sources": list(self.names),
            "source_dims": {n: self.questions[n].dim for n in self.names},
            "source_weights": [float(x) for x in self.source_weights],
            "source_aggregate": self.source_aggregate,
            "word_aggregate": self.word_aggregate,
            "dim": self.dim,
        }

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any], idf_table: IdfTable) -> FeatureSet:
        """A feature set with no texts (widths, ``u`` and aggregates of :meth:`recipe`).

        Raises:
          ValueError: a recipe that lacks a field.
        """
        try:
            names = [str(n) for n in recipe["sources"]]
            dims = {n: int(recipe["source_dims"][n]) for n in names}
            empty = {n: TextFeatures(np.zeros((0, dims[n]), np.float32),
                                     np.zeros(1, np.int64), np.zeros((0, dims[n]), np.float32))
                     for n in names}
            return cls(names=names, questions=empty, paragraphs=dict(empty),
                       source_weights=np.asarray(recipe["source_weights"], np.float32),
                       source_aggregate=str(recipe["source_aggregate"]),
                       word_aggregate=str(recipe["word_aggregate"]), idf_table=idf_table)
        except (KeyError, TypeError) as err:
            raise ValueError(f"feature recipe lacks or mistypes {err}") from None

    def with_texts(self, texts: Mapping[str, TextFeatures]) -> FeatureSet:
        """The same recipe over other texts (both sides: ``{name: TextFeatures}``)."""
        return dataclasses.replace(self, questions=dict(texts), paragraphs=dict(texts))


def _hash_texts(digest, texts: Sequence[str]) -> None:
    digest.update(len(texts).to_bytes(8, "little"))
    for t in texts:
        b = t.encode("utf-8")
        digest.update(len(b).to_bytes(8, "little"))
        digest.update(b)


def idf_fingerprint(table: IdfTable) -> str:
    """sha256 of an IDF table (its words, values and corpus size; a unit table is marked, so
    its features never share a cache entry with IDF-weighted ones)."""
    prefix = "unit|" if table.unit else ""  # "" keeps the keys of IDF entries as they were
    digest = hashlib.sha256(f"{prefix}N={table.num_documents}".encode())
    for word in sorted(table):
        digest.update(f"{word}\x00{table[word]!r}\x01".encode())
    return digest.hexdigest()


def feature_cache_key(
    texts: Sequence[str], spec: SourceSpec, idf_hash: str, layer_aggregate: str,
    word_aggregate: str,
) -> str:
    """sha256 over everything a cached :class:`TextFeatures` depends on."""
    digest = hashlib.sha256()
    for part in (FEATURE_CACHE_VERSION, spec.fingerprint, repr(spec.layer_weights),
                 layer_aggregate, word_aggregate, idf_hash):
        b = part.encode("utf-8")
        digest.update(len(b).to_bytes(8, "little"))
        digest.update(b)
    _hash_texts(digest, texts)
    return digest.hexdigest()



def compute_text_features(
    texts: Sequence[str],
    source: WordSource,
    idf_table: IdfTable,
    *,
    mixture: Mixture,
    layer_weights: Sequence[float] | None = None,
    layer_aggregate: str = "sum",
    word_aggregate: str = "average",
    batch_size: int = 64,
    chunk: int = 512,
    progress: str | None = None,
) -> TextFeatures:
    """``mixture`` of one source over texts in length order, stored flat.

    Texts are processed shortest first (less padding in the encoder and the mixture), in
    calls of ``chunk`` texts (bounds the memory of one call; each call compiles its own
    mixture function, so calls are few) and batches of ``batch_size``, then put back in
    input order.

    Returns:
      :class:`TextFeatures` of the texts, in input order.

    Raises:
      ValueError: no text.
    """
    if not texts:
        raise ValueError("compute_text_features needs at least one text")
    counts = np.array([len(tokenize_words(t)) for t in texts], np.int64)
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    order = np.argsort(counts, kind="stable")
    words = vectors = None
    chunks = range(0, len(texts), chunk)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=progress, unit="chunk", leave=False)
    for start in chunks:
        rows = order[start:start + chunk]
        matrices, text_vectors = mixture(
            [texts[i] for i in rows], source, idf_table, layer_weights=layer_weights,
            layer_aggregate=layer_aggregate, word_aggregate=word_aggregate,
            batch_size=batch_size)
        if words is None:
            dim = text_vectors.shape[1]
            words = np.zeros((int(offsets[-1]), dim), np.float32)
            vectors = np.zeros((len(texts), dim), np.float32)
        for r, i in enumerate(rows):
            words[offsets[i]:offsets[i + 1]] = matrices[r]
        vectors[rows] = text_vectors
    return TextFeatures(words=words, offsets=offsets, vectors=vectors)



def _load_cached(folder: Path) -> TextFeatures | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
        feats = TextFeatures(
            words=np.load(folder / "words.npy", mmap_mode="r"),
            offsets=np.load(folder / "offsets.npy"),
            vectors=np.load(folder / "vectors.npy"),
        )
    except (OSError, ValueError):
        return None  # unreadable entry: re-create it
    if (feats.words.shape[0] != int(feats.offsets[-1])
            or feats.vectors.shape[0] != len(feats.offsets) - 1
            or meta.get("num_texts") != len(feats.offsets) - 1):
        return None
    return feats


def _save_atomic(folder: Path, feats: TextFeatures, meta: Mapping[str, Any]) -> None:
    """Writes into a temporary folder beside ``folder`` and renames it into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        np.save(tmp / "words.npy", np.ascontiguousarray(feats.words))
        np.save(tmp / "offsets.npy", feats.offsets)
        np.save(tmp / "vectors.npy", feats.vectors)
        (tmp / "meta.json").write_text(json.dumps(dict(meta), indent=2))
        if folder.exists():  # a stale or concurrent entry: replace it
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached_text_features(
    texts: Sequence[str],
    spec: SourceSpec,
    idf_table: IdfTable,
    *,
    mixture: Mixture,
    layer_aggregate: str = "sum",
    word_aggregate: str = "average",
    use_cache: bool = True,
    what: str = "texts",
    source_cache: dict[str, WordSource] | None = None,
) -> TextFeatures:
    """:func:`compute_text_features` through the on-disk cache.

    The entry is ``cache_dir()/mrwe_features/<key>/`` with ``words.npy`` (memory-mapped on
    load), ``offsets.npy``, ``vectors.npy`` and ``meta.json``; ``key`` is
    :func:`feature_cache_key` (texts, source fingerprint incl. model files, layer weights
    and aggregates, IDF table). Written to a temporary folder and renamed, so a killed run
    never leaves a half entry; an unreadable entry is re-created.

    Args:
      mixture: the model's ``f_mixture`` (see :data:`Mixture`).
      source_cache: built sources by name, shared between calls (MiniLM loads once).
    """
    key = feature_cache_key(texts, spec, idf_fingerprint(idf_table), layer_aggregate,
                            word_aggregate)
    folder = cache_dir() / "mrwe_features" / key
    if use_cache and folder.is_dir():
        cached = _load_cached(folder)
        if cached is not None:
            logging.info("mrwe: %s %s features from cache %s", spec.name, what, folder)
            return cached
    if source_cache is not None and spec.name in source_cache:
        source = source_cache[spec.name]
    else:
        source = spec.build()
        if source_cache is not None:
            source_cache[spec.name] = source
    feats = compute_text_features(
        texts, source, idf_table, mixture=mixture, layer_weights=spec.layer_weights,
        layer_aggregate=layer_aggregate, word_aggregate=word_aggregate,
        progress=f"{spec.name} {what}",
    )
    if use_cache:
        _save_atomic(folder, feats, {"source": spec.fingerprint, "what": what,
                                     "num_texts": len(texts), "dim": feats.dim,
                                     "layer_weights": list(spec.layer_weights),
                                     "layer_aggregate": layer_aggregate,
                                     "word_aggregate": word_aggregate})
        reloaded = _load_cached(folder)
        if reloaded is not None:
            return reloaded
    return feats


def resolve_source_weights(value: str, names: Sequence[str],
                           paragraph_vectors: Mapping[str, np.ndarray]) -> np.ndarray:
    """``u`` from ``config.source_weights``.

    - ``"uniform"`` (default; the paper gives no values, so equal weights are our reading);
    - ``"balanced"``: ``u_j`` proportional to ``1 / RMS_i ||v_i^j||`` over the paragraph
      text vectors, so each source contributes the same mean squared norm to the
      concatenation (our addition: with uniform ``u`` the source with the largest vectors
      dominates the cosine);
    - ``"a,b,c"``: explicit non-negative weights, one per source.

    Returns:
      ``[n_sources]`` float32 summing to 1.

    Raises:
      ValueError: wrong count, negative or all-zero weights.
    """
    if value in ("", "uniform"):
        return normalized_weights(np.ones(len(names)), "config.source_weights")
    if value == "balanced":
        rms = []
        for n in names:
            v = np.asarray(paragraph_vectors[n], np.float64)
            r = math.sqrt(float(np.mean(np.sum(v * v, axis=1))))
            rms.append(1.0 / r if r > 0 else 0.0)
        return normalized_weights(rms, "balanced source weights")
    weights = parse_list(value, float)
    if len(weights) != len(names):
        raise ValueError(
            f"config.source_weights has {len(weights)} entries for sources {list(names)}")
    return normalized_weights(weights, "config.source_weights")


WORD_WEIGHTS = ("idf", "unit")


def word_weight_table(config: Any, paragraph_texts: Sequence[str]) -> IdfTable:
    """The per-word weights of ``f_mixture`` that ``config.word_weights`` names.

    - ``"idf"`` (default; the paper): ``ln(N / df(w))`` over the paragraphs
      (:func:`data_pipelines.word_sources.idf`);
    - ``"unit"``: every word weighs 1 (IDF weighting off; ``IdfTable.unit_weights``), so a
      word's vector is its plain layer mixture.

    A config without the field (older runs) means ``"idf"``.

    Raises:
      ValueError: another value.
    """
    value = config.get("word_weights", "idf") if hasattr(config, "get") else "idf"
    if value not in WORD_WEIGHTS:
        raise ValueError(f"config.word_weights={value!r}: use one of {WORD_WEIGHTS}")
    if value == "unit":
        return IdfTable.unit_weights(len(paragraph_texts))
    return idf(paragraph_texts)


def build_features(
    config: Any, corpus: RetrievalCorpus, *, mixture: Mixture, use_cache: bool = True,
    specs: Sequence[SourceSpec] | None = None,
) -> FeatureSet:
    """Features of every question and paragraph of ``corpus`` for the configured sources.

    IDF: ``ln(N / df(w))`` over all paragraphs of the corpus (the knowledge base; no
    labels are used), for questions and paragraphs alike; ``config.word_weights="unit"``
    weighs every word 1 instead (:func:`word_weight_table`).

    Args:
      config: fields ``sources`` and the source fields (:func:`source_specs`),
        ``layer_aggregate``, ``word_aggregate``, ``source_aggregate``, ``source_weights``.
      mixture: the model's ``f_mixture`` (see :data:`Mixture`).
      specs: override the sources (tests).

    Returns:
      :class:`FeatureSet`.
    """
    specs = list(specs) if specs is not None else source_specs(config)
    idf_table = word_weight_table(config, corpus.paragraph_texts)
    built: dict[str, WordSource] = {}
    questions, paragraphs = {}, {}
    for spec in specs:
        for what, texts, out in (("paragraphs", corpus.paragraph_texts, paragraphs),
                                 ("questions", corpus.question_texts, questions)):
            out[spec.name] = cached_text_features(
                texts, spec, idf_table, mixture=mixture,
                layer_aggregate=config.layer_aggregate,
                word_aggregate=config.word_aggregate, use_cache=use_cache, what=what,
                source_cache=built)
    names = [s.name for s in specs]
    u = resolve_source_weights(config.source_weights, names,
                               {n: paragraphs[n].vectors for n in names})
    feats = FeatureSet(names=names, questions=questions, paragraphs=paragraphs,
                       source_weights=u, source_aggregate=config.source_aggregate,
                       word_aggregate=config.word_aggregate, idf_table=idf_table)
    _ = feats.dim  # fails early on an impossible aggregate
    if config.source_aggregate != "concatenate":
        widths = {n: paragraphs[n].dim for n in names}
        if len(set(widths.values())) > 1:
            raise ValueError(f"source_aggregate={config.source_aggregate!r} needs sources of "
                             f"one width, got {widths}; use 'concatenate'")
    return feats


