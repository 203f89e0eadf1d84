"""Per-source word features of a retrieval corpus, cached on disk (``docs/mrwe.md``)."""

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
from typing import Any

import numpy as np

from data_pipelines.retrieval_corpus import RetrievalCorpus
from embedding_core.models.glove import glove_files
from embedding_core.storage.storage import cache_dir
from mrwe_jax.features.sources import (
    ContextualSource,
    GloveSource,
    HashedTfidfSource,
    IdfTable,
    WordSource,
    idf,
    tokenize_words,
)

SOURCE_KINDS = ("glove", "contextual", "tfidf")
FEATURE_CACHE_VERSION = "mrwe_features v1"
WORD_WEIGHTS = ("idf", "unit")


# f_mixture with fixed coefficients and word pooling of one source: (texts, source,
# idf_table, *, layer_weights, layer_aggregate, word_aggregate, batch_size) -> (word
# matrices [num_words_i, d_j] per text, text vectors [n, d_j]) float32.
Mixture = Callable[..., tuple[list[np.ndarray], np.ndarray]]


def normalized_weights(weights: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """Non-negative weights scaled to sum 1 (m, u); ValueError: a negative entry, zero sum."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"{what} must be non-negative with a positive sum, got {list(w)}")
    return (w / w.sum()).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One configured source: kind ``name``, L_j, m^j, the cache ``fingerprint``, ``build()``."""

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
    """``config.sources``'s specs in ensemble order; ValueError, FileNotFoundError."""
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
            from embedding_core.models.pretrained import resolve_model_dir

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


@dataclasses.dataclass
class TextFeatures:
    """One source's words of n texts, flat (text i: ``words[offsets[i]:offsets[i + 1]]``),
    ``vectors``."""

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
    """Per-source features of a corpus's questions and paragraphs, u, aggregates, IDF table."""

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
    def widths(self) -> list[int]:
        """d_j of each source, in ensemble order."""
        return [self.questions[n].dim for n in self.names]

    @property
    def dim(self) -> int:
        """d'', the width of the ensemble."""
        widths = self.widths
        return sum(widths) if self.source_aggregate == "concatenate" else widths[0]

    def lengths(self, side: str) -> np.ndarray:
        """``[n]`` int64 words per text of one side."""
        return self.side(side)[self.names[0]].lengths

    def recipe(self) -> dict[str, Any]:
        """``features.json``: what embedding new texts needs besides the IDF table."""
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
        """A feature set of no texts from :meth:`recipe` (ValueError if a field lacks)."""
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


def idf_fingerprint(table: IdfTable) -> str:
    """sha256 of an IDF table's words, values and N (a unit table is marked apart)."""
    prefix = "unit|" if table.unit else ""  # "" keeps the keys of IDF entries as they were
    digest = hashlib.sha256(f"{prefix}N={table.num_documents}".encode())
    for word in sorted(table):
        digest.update(f"{word}\x00{table[word]!r}\x01".encode())
    return digest.hexdigest()


def feature_cache_key(texts: Sequence[str], spec: SourceSpec, idf_hash: str,
                      layer_aggregate: str, word_aggregate: str) -> str:
    """sha256 over everything a cached :class:`TextFeatures` depends on."""
    digest = hashlib.sha256()
    for part in (FEATURE_CACHE_VERSION, spec.fingerprint, repr(spec.layer_weights),
                 layer_aggregate, word_aggregate, idf_hash):
        b = part.encode("utf-8")
        digest.update(len(b).to_bytes(8, "little"))
        digest.update(b)
    digest.update(len(texts).to_bytes(8, "little"))
    for t in texts:
        b = t.encode("utf-8")
        digest.update(len(b).to_bytes(8, "little"))
        digest.update(b)
    return digest.hexdigest()


def compute_text_features(texts: Sequence[str], source: WordSource, idf_table: IdfTable, *,
                          mixture: Mixture, layer_weights: Sequence[float] | None = None,
                          layer_aggregate: str = "sum", word_aggregate: str = "average",
                          batch_size: int = 64, chunk: int = 512,
                          progress: str | None = None) -> TextFeatures:
    """``mixture`` of one source, shortest texts first, in input order; ValueError: no text."""
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


def cached_text_features(texts: Sequence[str], spec: SourceSpec, idf_table: IdfTable, *,
                         mixture: Mixture, layer_aggregate: str = "sum",
                         word_aggregate: str = "average", use_cache: bool = True,
                         what: str = "texts",
                         source_cache: dict[str, WordSource] | None = None) -> TextFeatures:
    """:func:`compute_text_features` through the cache (atomic; bad entries re-created)."""
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
    """u (sum 1) of ``config.source_weights``: uniform, balanced or ``"a,b,c"``; ValueError."""
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


def word_weight_table(config: Any, paragraph_texts: Sequence[str]) -> IdfTable:
    """``f_mixture``'s word weights: ``"idf"`` over the paragraphs or ``"unit"``; ValueError."""
    value = config.get("word_weights", "idf") if hasattr(config, "get") else "idf"
    if value not in WORD_WEIGHTS:
        raise ValueError(f"config.word_weights={value!r}: use one of {WORD_WEIGHTS}")
    return IdfTable.unit_weights(len(paragraph_texts)) if value == "unit" else idf(paragraph_texts)


def build_features(config: Any, corpus: RetrievalCorpus, *, mixture: Mixture,
                   use_cache: bool = True, specs: Sequence[SourceSpec] | None = None
                   ) -> FeatureSet:
    """Features of every question and paragraph; ValueError: sum / average of unequal widths."""
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
    if config.source_aggregate != "concatenate":
        widths = {n: paragraphs[n].dim for n in names}
        if len(set(widths.values())) > 1:
            raise ValueError(f"source_aggregate={config.source_aggregate!r} needs sources of "
                             f"one width, got {widths}; use 'concatenate'")
    return feats
