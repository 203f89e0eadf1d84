"""SQuAD retrieval data for multi-resolution embeddings: corpus, cached features, P x K batches.

Three jobs, in the order a run needs them:

1. :func:`load_corpus`: SQuAD paragraphs (the knowledge base) and questions, each question
   pointing at its paragraph, split into train and test questions by article (default; the
   test questions *and* their paragraphs are unseen in training) or with the authors'
   seen-paragraph split (``split="seen_paragraphs"``: for reproduction only).
2. :func:`build_features`: per embedding source (GloVe, MiniLM hidden states, hashed TF-IDF)
   the IDF-weighted layer mixture ``x_i^j`` of every word of every text
   (``mrwe_jax.embeddings.embed_texts`` with one source at a time) and the pooled text
   vectors, computed once and cached on disk under
   ``data_pipelines.paths.cache_dir()/mrwe_features/<sha256 of the inputs>/``. The ensemble
   over sources (``f_ensemble``) is *not* cached: it is applied on the fly
   (:func:`ensemble_vectors` on the host, ``mrwe_jax.trainer.text_batch`` on the device), so
   the source weights ``u`` can change without recomputing anything.
3. :class:`PKBatches`: P x K batches for the batch-hard triplet loss: P paragraphs, and K
   of each paragraph's questions (labels = paragraph index; questions are the anchors,
   paragraphs the candidates), deterministic per ``(seed, step)`` and so resumable.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data_pipelines.paths import cache_dir
from data_pipelines.pk_sampler import pk_sample_batches
from data_pipelines.squad import (
    SquadSkips,
    read_squad,
    split_articles,
    split_seen_paragraphs,
)
from embedding_core.glove import glove_files
from mrwe_jax import embeddings as mr

SPLITS = ("articles", "seen_paragraphs")
SOURCE_KINDS = ("glove", "contextual", "tfidf")
FEATURE_CACHE_VERSION = "mrwe_features v1"


# --------------------------------------------------------------------------- corpus


@dataclasses.dataclass(frozen=True)
class RetrievalCorpus:
    """SQuAD as a retrieval task: every question has exactly one relevant paragraph.

    Attributes:
      paragraph_ids: ``[n_p]`` ids ``"{title}#{index}"`` (``data_pipelines.squad``).
      paragraph_texts: ``[n_p]`` contexts, file order.
      paragraph_article: ``[n_p]`` int64 article index (file order).
      question_ids: ``[n_q]`` SQuAD question ids.
      question_texts: ``[n_q]`` questions, file order.
      question_paragraph: ``[n_q]`` int64 index of each question's paragraph.
      train_questions, test_questions: ``[n_q]`` bool, disjoint.
      train_paragraphs: ``[n_p]`` bool, paragraphs that may appear in training batches.
      test_pool: ``[n_p]`` bool, paragraphs of the test articles (article split) or every
        paragraph (seen-paragraph split): the "test" retrieval pool.
      split: ``"articles"`` or ``"seen_paragraphs"``.
      source: the file that was read.
      skips: what ``read_squad(skip_invalid=True)`` dropped (all zero otherwise).
    """

    paragraph_ids: list[str]
    paragraph_texts: list[str]
    paragraph_article: np.ndarray
    question_ids: list[str]
    question_texts: list[str]
    question_paragraph: np.ndarray
    train_questions: np.ndarray
    test_questions: np.ndarray
    train_paragraphs: np.ndarray
    test_pool: np.ndarray
    split: str
    source: str
    skips: SquadSkips

    def summary(self) -> str:
        """One line: sizes of the split, for logs."""
        return (
            f"{len(self.paragraph_ids)} paragraphs, {len(self.question_ids)} questions "
            f"({self.split} split: {int(self.train_questions.sum())} train / "
            f"{int(self.test_questions.sum())} test questions, "
            f"{int(self.train_paragraphs.sum())} train paragraphs, "
            f"{int(self.test_pool.sum())} test-pool paragraphs) from {self.source}"
        )


def load_corpus(
    path: str | os.PathLike[str] | None = None,
    *,
    split: str = "articles",
    test_fraction: float = 0.2,
    seed: int = 0,
    skip_invalid: bool = False,
) -> RetrievalCorpus:
    """Reads a SQuAD v1.1 file and splits its questions for retrieval.

    Args:
      path: SQuAD ``.json`` or zip; default the shipped dev set.
      split: ``"articles"`` (``data_pipelines.squad.split_articles``: whole articles go to
        test, so test questions and their paragraphs are never trained on; the project's
        protocol) or ``"seen_paragraphs"`` (``split_seen_paragraphs``: the authors' split of
        questions, where test questions ask about paragraphs seen in training; a leak kept
        only to reproduce their numbers).
      test_fraction: share of articles (or questions) for test, in (0, 1).
      seed: seed of the split.
      skip_invalid: drop and count paragraphs with an empty context or without questions and
        empty questions (``read_squad``) instead of raising.

    Returns:
      :class:`RetrievalCorpus`.

    Raises:
      data_pipelines.errors.DataError: a malformed record (file, field naming the record,
        e.g. ``data[0] 'Title'.paragraphs[3].context``), unless skippable and skipped.
      ValueError: unknown ``split``; a split with no train or no test question.
      FileNotFoundError: no such file.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    articles, skips = read_squad(path, skip_invalid=skip_invalid)
    splitter = split_articles if split == "articles" else split_seen_paragraphs
    train_articles, test_articles = splitter(articles, test_fraction, seed)

    def qids(side) -> set[str]:
        return {q.qid for a in side for p in a.paragraphs for q in p.questions}

    def pids(side) -> set[str]:
        return {p.paragraph_id for a in side for p in a.paragraphs}

    train_qids, test_qids = qids(train_articles), qids(test_articles)
    train_pids = {p.paragraph_id for a in train_articles for p in a.paragraphs if p.questions}
    test_pids = pids(test_articles)
    paragraph_ids, paragraph_texts, paragraph_article = [], [], []
    question_ids, question_texts, question_paragraph = [], [], []
    for a_index, article in enumerate(articles):
        for paragraph in article.paragraphs:
            p_index = len(paragraph_ids)
            paragraph_ids.append(paragraph.paragraph_id)
            paragraph_texts.append(paragraph.context)
            paragraph_article.append(a_index)
            for q in paragraph.questions:
                question_ids.append(q.qid)
                question_texts.append(q.question)
                question_paragraph.append(p_index)
    train_q = np.array([q in train_qids for q in question_ids], bool)
    test_q = np.array([q in test_qids for q in question_ids], bool)
    if not train_q.any() or not test_q.any():
        raise ValueError(
            f"the {split} split of {len(question_ids)} questions with test_fraction="
            f"{test_fraction} leaves {int(train_q.sum())} train and {int(test_q.sum())} test "
            "questions; both must be non-empty"
        )
    source = str(path) if path is not None else "shipped SQuAD v1.1 dev"
    return RetrievalCorpus(
        paragraph_ids=paragraph_ids,
        paragraph_texts=paragraph_texts,
        paragraph_article=np.asarray(paragraph_article, np.int64),
        question_ids=question_ids,
        question_texts=question_texts,
        question_paragraph=np.asarray(question_paragraph, np.int64),
        train_questions=train_q,
        test_questions=test_q,
        train_paragraphs=np.array([p in train_pids for p in paragraph_ids], bool),
        test_pool=np.array([p in test_pids for p in paragraph_ids], bool),
        split=split,
        source=source,
        skips=skips,
    )


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
    build: Callable[[], mr.WordSource]


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
    return tuple(float(w) for w in mr.normalized_weights(weights, name))


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
                                    lambda folder=folder: mr.GloveSource(folder)))
        elif name == "tfidf":
            dim, seed = int(config.tfidf_dim), int(config.tfidf_seed)
            specs.append(SourceSpec("tfidf", 1, (1.0,), f"tfidf|dim={dim}|seed={seed}",
                                    lambda dim=dim, seed=seed: mr.HashedTfidfSource(dim, seed)))
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
                    mr.ContextualSource.from_pretrained(d, layers=la, max_length=ml,
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
    idf_table: mr.IdfTable

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


def _hash_texts(digest, texts: Sequence[str]) -> None:
    digest.update(len(texts).to_bytes(8, "little"))
    for t in texts:
        b = t.encode("utf-8")
        digest.update(len(b).to_bytes(8, "little"))
        digest.update(b)


def idf_fingerprint(table: mr.IdfTable) -> str:
    """sha256 of an IDF table (its words, values and corpus size)."""
    digest = hashlib.sha256(f"N={table.num_documents}".encode())
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
    source: mr.WordSource,
    idf_table: mr.IdfTable,
    *,
    layer_weights: Sequence[float] | None = None,
    layer_aggregate: str = "sum",
    word_aggregate: str = "average",
    batch_size: int = 64,
    chunk: int = 512,
    progress: str | None = None,
) -> TextFeatures:
    """``mrwe_jax.embeddings.embed_texts`` with one source, texts in length order.

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
    weights = None if layer_weights is None else (tuple(layer_weights),)
    module = mr.MultiResolutionEmbedding(
        (source.num_layers,), layer_weights=weights, source_weights=(1.0,),
        layer_aggregate=layer_aggregate, source_aggregate="concatenate",
        word_aggregate=word_aggregate,
    )
    counts = np.array([len(mr.tokenize_words(t)) for t in texts], np.int64)
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
        out = mr.embed_texts([texts[i] for i in rows], [source], idf_table, module,
                             batch_size=batch_size)
        if words is None:
            dim = out.vectors.shape[1]
            words = np.zeros((int(offsets[-1]), dim), np.float32)
            vectors = np.zeros((len(texts), dim), np.float32)
        for r, i in enumerate(rows):
            words[offsets[i]:offsets[i + 1]] = out.word_matrices[r]
        vectors[rows] = out.vectors
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
    idf_table: mr.IdfTable,
    *,
    layer_aggregate: str = "sum",
    word_aggregate: str = "average",
    use_cache: bool = True,
    what: str = "texts",
    source_cache: dict[str, mr.WordSource] | None = None,
) -> TextFeatures:
    """:func:`compute_text_features` through the on-disk cache.

    The entry is ``cache_dir()/mrwe_features/<key>/`` with ``words.npy`` (memory-mapped on
    load), ``offsets.npy``, ``vectors.npy`` and ``meta.json``; ``key`` is
    :func:`feature_cache_key` (texts, source fingerprint incl. model files, layer weights
    and aggregates, IDF table). Written to a temporary folder and renamed, so a killed run
    never leaves a half entry; an unreadable entry is re-created.

    Args:
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
        texts, source, idf_table, layer_weights=spec.layer_weights,
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
        return mr.normalized_weights(np.ones(len(names)), "config.source_weights")
    if value == "balanced":
        rms = []
        for n in names:
            v = np.asarray(paragraph_vectors[n], np.float64)
            r = math.sqrt(float(np.mean(np.sum(v * v, axis=1))))
            rms.append(1.0 / r if r > 0 else 0.0)
        return mr.normalized_weights(rms, "balanced source weights")
    weights = parse_list(value, float)
    if len(weights) != len(names):
        raise ValueError(
            f"config.source_weights has {len(weights)} entries for sources {list(names)}")
    return mr.normalized_weights(weights, "config.source_weights")


def build_features(
    config: Any, corpus: RetrievalCorpus, *, use_cache: bool = True,
    specs: Sequence[SourceSpec] | None = None,
) -> FeatureSet:
    """Features of every question and paragraph of ``corpus`` for the configured sources.

    IDF: ``ln(N / df(w))`` over all paragraphs of the corpus (the knowledge base; no
    labels are used), for questions and paragraphs alike.

    Args:
      config: fields ``sources`` and the source fields (:func:`source_specs`),
        ``layer_aggregate``, ``word_aggregate``, ``source_aggregate``, ``source_weights``.
      specs: override the sources (tests).

    Returns:
      :class:`FeatureSet`.
    """
    specs = list(specs) if specs is not None else source_specs(config)
    idf_table = mr.idf(corpus.paragraph_texts)
    built: dict[str, mr.WordSource] = {}
    questions, paragraphs = {}, {}
    for spec in specs:
        for what, texts, out in (("paragraphs", corpus.paragraph_texts, paragraphs),
                                 ("questions", corpus.question_texts, questions)):
            out[spec.name] = cached_text_features(
                texts, spec, idf_table, layer_aggregate=config.layer_aggregate,
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


def ensemble_vectors(features: FeatureSet, side: str, names: Sequence[str] | None = None,
                     indices: np.ndarray | None = None) -> np.ndarray:
    """Text vectors of the ensemble (``f_ensemble`` of the pooled per-source vectors).

    Pooling over words is linear and so is the ensemble, so this equals pooling the
    ensembled word matrices. With ``names`` a subset, only those sources (weights
    renormalised); a single name gives that source's own text vectors.

    Returns:
      ``[n, d'']`` float32.
    """
    import jax

    from mrwe_jax.embeddings import ensemble_sources

    names = list(features.names if names is None else names)
    keep = [features.names.index(n) for n in names]
    u = mr.normalized_weights(features.source_weights[keep], "source weights")
    feats = features.side(side)
    parts = [feats[n].vectors if indices is None else feats[n].vectors[indices]
             for n in names]
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        out = ensemble_sources([np.asarray(p) for p in parts], np.asarray(u),
                               features.source_aggregate)
    return np.asarray(out, np.float32)


# --------------------------------------------------------------------------- batches


def bucket_width(length: int, minimum: int = 16) -> int:
    """Padded word count: the next power of two from ``minimum`` (few compiled shapes)."""
    size = minimum
    while size < length:
        size *= 2
    return size


def side_arrays(features: FeatureSet, side: str, indices: np.ndarray, *, with_words: bool,
                width: int | None = None, prefix: str = "") -> dict[str, np.ndarray]:
    """Host arrays of one side for ``mrwe_jax.trainer.text_batch``.

    With words: ``{prefix+name: [b, width, d_j] float32, prefix+"mask": [b, width] bool}``
    (``width`` default: :func:`bucket_width` of the longest text); without:
    ``{prefix+name: [b, d_j] float32}`` pooled vectors (FCRR needs no word matrix).
    """
    feats = features.side(side)
    indices = np.asarray(indices, np.int64)
    if not with_words:
        return {prefix + n: np.asarray(feats[n].vectors[indices], np.float32)
                for n in features.names}
    lengths = feats[features.names[0]].lengths[indices]
    if width is None:
        width = bucket_width(int(lengths.max(initial=1)))
    out = {prefix + n: feats[n].padded(indices, width) for n in features.names}
    out[prefix + "mask"] = np.arange(width)[None, :] < lengths[:, None]
    return out


class PKBatches:
    """P x K batches of (paragraph, its questions) for the batch-hard triplet loss.

    Step s belongs to epoch ``s // steps_per_epoch``; the epoch's batches come from
    ``data_pipelines.pk_sampler.pk_sample_batches(question_paragraph, P, K, seed, epoch)``
    over the training questions (an epoch visits every training paragraph once; a
    paragraph with fewer than K questions repeats some, ``small_groups="replace"``), so
    the batch of a step depends only on ``(seed, step)`` and a resumed run continues the
    same sequence.

    Each batch (global; a process gets its contiguous share of both sides):
      - questions: ``"q_<source>"`` and ``"q_mask"`` (words) or ``"q_<source>"`` vectors,
        ``"q_label"`` ``[P*K]`` int32 paragraph index, group-major;
      - paragraphs: ``"p_<source>"`` (and ``"p_mask"``), ``"p_label"`` ``[P]`` int32;
      - ``"step"``: the step (checked by the training loop).

    Question word matrices have one width for the whole run (the longest question, rounded
    up to a multiple of 8); paragraph widths are powers of two per batch (few compiled
    shapes), or ``max_paragraph_words`` when set (longer paragraphs are cut: the word
    matrix and the pooled text vector then see only the first words).

    Args:
      features: the corpus features.
      question_paragraph: ``[n_q]`` int paragraph of each question (all questions).
      train_questions: ``[n_q]`` bool.
      P, K: paragraphs per batch, questions per paragraph.
      seed: sampling seed.
      with_words: include word matrices (ConvRR) or only vectors (FCRR).
      small_groups: ``pk_sample_batches`` policy for paragraphs with < K questions.
      max_paragraph_words: 0 = no cap.
      process_index, process_count: this process's share.

    Raises:
      ValueError: fewer than P eligible training paragraphs; P or P*K not divisible by
        ``process_count``.
    """

    def __init__(
        self,
        features: FeatureSet,
        question_paragraph: np.ndarray,
        train_questions: np.ndarray,
        *,
        P: int,
        K: int,
        seed: int,
        with_words: bool,
        small_groups: str = "replace",
        max_paragraph_words: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ) -> None:
        if P % process_count or (P * K) % process_count:
            raise ValueError(f"P={P} and P*K={P * K} must be divisible by the process count "
                             f"{process_count}")
        self.features = features
        self.question_paragraph = np.asarray(question_paragraph, np.int64)
        self.train_q = np.flatnonzero(train_questions)
        if self.train_q.size == 0:
            raise ValueError("no training question")
        self.P, self.K, self.seed = int(P), int(K), int(seed)
        self.with_words = with_words
        self.small_groups = small_groups
        self.max_paragraph_words = int(max_paragraph_words)
        self.process_index, self.process_count = process_index, process_count
        q_len = features.lengths("questions")[self.train_q]
        self.question_width = max(8, -(-int(q_len.max(initial=1)) // 8) * 8)
        self._epoch: tuple[int, list[np.ndarray]] | None = None
        self.steps_per_epoch = len(self._epoch_batches(0))

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self._epoch is None or self._epoch[0] != epoch:
            groups = self.question_paragraph[self.train_q]
            batches = pk_sample_batches(groups, self.P, self.K, self.seed, epoch,
                                        small_groups=self.small_groups)
            self._epoch = (epoch, [self.train_q[b] for b in batches])
        return self._epoch[1]

    def question_indices(self, step: int) -> np.ndarray:
        """``[P*K]`` int64 question indices of the global batch of ``step``."""
        epoch, within = divmod(int(step), self.steps_per_epoch)
        return self._epoch_batches(epoch)[within]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's host batch of ``step`` (see the class docstring)."""
        q = self.question_indices(step)
        p = self.question_paragraph[q[:: self.K]]  # group-major: one per group
        qs = _process_slice(q, self.process_index, self.process_count)
        ps = _process_slice(p, self.process_index, self.process_count)
        out: dict[str, np.ndarray] = {"step": np.asarray(step, np.int64)}
        out.update(side_arrays(self.features, "questions", qs, with_words=self.with_words,
                               width=self.question_width, prefix="q_"))
        width = None
        if self.with_words:
            longest = int(self.features.lengths("paragraphs")[p].max(initial=1))
            width = bucket_width(longest, 64)
            if self.max_paragraph_words:
                width = min(width, self.max_paragraph_words)
        out.update(side_arrays(self.features, "paragraphs", ps, with_words=self.with_words,
                               width=width, prefix="p_"))
        out["q_label"] = self.question_paragraph[qs].astype(np.int32)
        out["p_label"] = ps.astype(np.int32)
        return out

    def iterator(self, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches from ``start_step`` on, forever (the loop decides when to stop)."""
        step = int(start_step)
        while True:
            yield self.batch(step)
            step += 1


def _process_slice(rows: np.ndarray, index: int, count: int) -> np.ndarray:
    per = len(rows) // count
    return rows[index * per:(index + 1) * per]
