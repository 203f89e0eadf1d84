"""MRWE's data: corpus features through the model's mixture, and P x K triplet batches.

1. :func:`load_data`: the SQuAD retrieval corpus (``data_pipelines.retrieval_corpus``) and
   its cached per-source word features (``data_pipelines.word_features``), computed with
   the model's ``f_mixture`` (:func:`mixture`, :func:`embed_texts`).
2. :func:`ensemble_vectors`: host-side ``f_ensemble`` of the pooled text vectors (the
   baselines' rows; the training input applies it on device, ``mrwe_jax.model.text_batch``).
3. :class:`PKBatches`: P x K batches for the batch-hard triplet loss: P paragraphs, and K
   of each paragraph's questions (labels = paragraph index; questions are the anchors,
   paragraphs the candidates), deterministic per ``(seed, step)`` and so resumable.

``docs/mrwe.md`` describes the method and the protocol.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence

import jax
import ml_collections
import numpy as np

from data_pipelines import word_features
from data_pipelines.pk_sampler import pk_sample_batches
from data_pipelines.retrieval_corpus import RetrievalCorpus, load_corpus
from data_pipelines.word_features import FeatureSet, SourceSpec, normalized_weights
from data_pipelines.word_sources import IdfTable, WordSource, tokenize_words
from mrwe_jax.model import MultiResolutionEmbedding, ensemble_sources

# Most padded word slots (rows x width) in one call of the mixture or of the tower: a
# batch of texts is padded to its longest text, so without a budget one long text costs
# batch_size times its own size (64 x 32768 slots x L x d for a 20,000-word text at the
# default batch sizes). 64 texts of up to 512 words fit as they are.
MAX_BATCH_WORDS = 64 * 512

# --------------------------------------------------------------------------- features


@dataclasses.dataclass
class MultiResolutionTexts:
    """Multi-resolution embeddings of n texts.

    Attributes:
      word_matrices: n arrays ``[num_words_i, d'']`` float32 (ConvRR input; ``[0, d'']`` for
        an empty text).
      vectors: ``[n, d'']`` float32 text vectors (zero for an empty text).
      idf_weights: n arrays ``[num_words_i]`` float32, the IDF of each word.
      is_empty: ``[n]`` bool, true for texts with no word.
    """

    word_matrices: list[np.ndarray]
    vectors: np.ndarray
    idf_weights: list[np.ndarray]
    is_empty: np.ndarray


def embed_texts(
    texts: Sequence[str],
    sources: Sequence[WordSource],
    idf_table: IdfTable,
    module: MultiResolutionEmbedding | None = None,
    *,
    batch_size: int = 128,
    max_batch_words: int | None = MAX_BATCH_WORDS,
) -> MultiResolutionTexts:
    """Sources, ``f_mixture``, ``f_ensemble`` and pooling with fixed coefficients on texts.

    Each call of the module gets ``[rows, width, L_j, d_j]`` per source, ``width`` the
    batch's longest text rounded up to a power of two; ``rows`` is ``batch_size``, or
    fewer (:func:`batch_rows`) when ``batch_size x width`` would exceed
    ``max_batch_words``, so memory grows linearly with a long text's word count instead of
    with ``batch_size`` times it. Batches within the budget are computed exactly as before.

    Args:
      texts: n strings.
      sources: the embedding models, in the order ``module.layer_counts`` expects.
      idf_table: from ``data_pipelines.word_sources.idf`` (OOV words: ``oov_idf``).
      module: fixed-coefficient :class:`MultiResolutionEmbedding` (learned coefficients
        need its params: apply it yourself); default: uniform m and u, layer sum, source
        concatenation, word average.
      batch_size: texts per call of the sources and of the module.
      max_batch_words: most padded word slots (rows x width) per module call; a single
        longer text is one row (``None``: always ``batch_size`` rows).

    Returns:
      :class:`MultiResolutionTexts`.

    Raises:
      ValueError: the module learns coefficients, or the sources disagree on word counts.
    """
    if module is None:
        module = MultiResolutionEmbedding(tuple(s.num_layers for s in sources))
    if module.learn_layer_weights or module.learn_source_weights:
        raise ValueError("embed_texts runs fixed coefficients; apply a learning module directly")
    run = jax.jit(lambda layers, idf_w, mask: module.apply({}, layers, idf_w, mask))
    matrices: list[np.ndarray] = []
    vectors: list[np.ndarray] = []
    idfs: list[np.ndarray] = []
    for b in range(0, len(texts), batch_size):
        chunk = list(texts[b : b + batch_size])
        per_source = [s.layer_tensors(chunk) for s in sources]
        counts = [t.shape[0] for t in per_source[0]]
        for j, tensors in enumerate(per_source[1:], start=1):
            if [t.shape[0] for t in tensors] != counts:
                raise ValueError(f"source {sources[j].name} disagrees on the number of words")
        weights = [idf_table.weights(tokenize_words(text)) for text in chunk]
        idfs += weights
        # Fixed batch rows and bucketed widths: few compilations; fewer rows for long texts.
        width = bucket_width(max(counts + [1]))
        rows = batch_rows(width, batch_size, max_batch_words)
        for g in range(0, len(chunk), rows):
            part = range(g, min(g + rows, len(chunk)))
            if rows != batch_size:
                width = bucket_width(max([counts[i] for i in part] + [1]))
            mask = np.zeros((rows, width), bool)
            idf_w = np.zeros((rows, width), np.float32)
            for r, i in enumerate(part):
                mask[r, : counts[i]] = True
                idf_w[r, : counts[i]] = weights[i]
            padded = []
            for s, tensors in zip(sources, per_source, strict=True):
                arr = np.zeros((rows, width, s.num_layers, s.dim), np.float32)
                for r, i in enumerate(part):
                    arr[r, : counts[i]] = tensors[i]
                padded.append(arr)
            words, text_vec = jax.device_get(run(padded, idf_w, mask))
            del padded
            for r, i in enumerate(part):
                matrices.append(np.array(words[r, : counts[i]]))  # a copy: frees the padding
            vectors.append(np.asarray(text_vec[: len(part)]))
        del per_source
    dim = vectors[0].shape[1] if vectors else 0
    return MultiResolutionTexts(
        word_matrices=matrices,
        vectors=np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32),
        idf_weights=idfs,
        is_empty=np.array([m.shape[0] == 0 for m in matrices], bool),
    )


def mixture(texts: Sequence[str], source: WordSource, idf_table: IdfTable, *,
            layer_weights: Sequence[float] | None, layer_aggregate: str, word_aggregate: str,
            batch_size: int = 64, max_batch_words: int | None = MAX_BATCH_WORDS
            ) -> tuple[list[np.ndarray], np.ndarray]:
    """``f_mixture`` and word pooling of one source (``data_pipelines.word_features.Mixture``).

    ``max_batch_words``: see :func:`embed_texts`.

    Returns:
      ``(word matrices [num_words_i, d_j] per text, text vectors [n, d_j])`` float32.
    """
    weights = None if layer_weights is None else (tuple(layer_weights),)
    module = MultiResolutionEmbedding(
        (source.num_layers,), layer_weights=weights, source_weights=(1.0,),
        layer_aggregate=layer_aggregate, source_aggregate="concatenate",
        word_aggregate=word_aggregate,
    )
    out = embed_texts(texts, [source], idf_table, module, batch_size=batch_size,
                      max_batch_words=max_batch_words)
    return out.word_matrices, out.vectors


def build_features(config: ml_collections.ConfigDict, corpus: RetrievalCorpus, *,
                   use_cache: bool = True, specs: Sequence[SourceSpec] | None = None
                   ) -> FeatureSet:
    """``data_pipelines.word_features.build_features`` with the model's :func:`mixture`."""
    return word_features.build_features(config, corpus, mixture=mixture, use_cache=use_cache,
                                        specs=specs)


def load_corpus_of(config: ml_collections.ConfigDict) -> RetrievalCorpus:
    """The corpus and split ``config`` names (``squad_path``, ``split``, ...)."""
    corpus = load_corpus(config.squad_path or None, split=config.split,
                         test_fraction=float(config.test_fraction),
                         seed=int(config.split_seed), skip_invalid=bool(config.skip_invalid))
    logging.info("mrwe: %s", corpus.summary())
    if any(dataclasses.astuple(corpus.skips)):
        logging.warning("mrwe: skipped invalid SQuAD records: %s", corpus.skips)
    return corpus


def load_data(config: ml_collections.ConfigDict, *, use_cache: bool = True
              ) -> tuple[RetrievalCorpus, FeatureSet]:
    """The corpus and its features as ``config`` describes them (features cached on disk)."""
    corpus = load_corpus_of(config)
    return corpus, build_features(config, corpus, use_cache=use_cache)


def ensemble_vectors(features: FeatureSet, side: str, names: Sequence[str] | None = None,
                     indices: np.ndarray | None = None) -> np.ndarray:
    """Text vectors of the ensemble (``f_ensemble`` of the pooled per-source vectors).

    Pooling over words is linear and so is the ensemble, so this equals pooling the
    ensembled word matrices. With ``names`` a subset, only those sources (weights
    renormalised); a single name gives that source's own text vectors.

    Returns:
      ``[n, d'']`` float32.
    """
    names = list(features.names if names is None else names)
    keep = [features.names.index(n) for n in names]
    u = normalized_weights(features.source_weights[keep], "source weights")
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


def batch_rows(width: int, batch_size: int, max_batch_words: int | None = MAX_BATCH_WORDS
               ) -> int:
    """Rows of a batch padded to ``width`` words: ``batch_size``, or when ``batch_size x
    width`` exceeds ``max_batch_words`` the largest power of two (below ``batch_size``,
    at least 1) that keeps ``rows x width`` within it (``None``: no limit).

    A batch then holds at most ``max(max_batch_words, width)`` padded word slots: memory
    is linear in the longest text's word count, whatever the batch size.
    """
    batch_size = int(batch_size)
    if not max_batch_words or batch_size * int(width) <= int(max_batch_words):
        return batch_size
    rows = 1
    while rows * 2 < batch_size and rows * 2 * int(width) <= int(max_batch_words):
        rows *= 2
    return rows


def side_arrays(features: FeatureSet, side: str, indices: np.ndarray, *, with_words: bool,
                width: int | None = None, prefix: str = "") -> dict[str, np.ndarray]:
    """Host arrays of one side for ``mrwe_jax.model.text_batch``.

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
