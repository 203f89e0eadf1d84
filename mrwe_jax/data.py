"""MRWE's batch contract (:data:`BATCH`), corpus features through the mixture, P x K batches."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence

import jax
import ml_collections
import numpy as np

from data_pipelines.pk_sampler import pk_sample_batches
from data_pipelines.retrieval_corpus import RetrievalCorpus, load_corpus
from embedding_core import BatchField
from mrwe_jax.features import cache as word_features
from mrwe_jax.features.cache import FeatureSet, SourceSpec, normalized_weights
from mrwe_jax.features.sources import IdfTable, WordSource, tokenize_words
from mrwe_jax.model import MultiResolutionEmbedding, ensemble_sources

_LABELS = {"q_label": BatchField("int", ("questions",)),
           "p_label": BatchField("int", ("paragraphs",))}
BATCH = {
    # ConvRR: per-source word matrices side by side (``FeatureSet.widths`` columns each)
    # and the real-word masks; q_label / p_label: paragraph index, questions group-major.
    "convrr": {**_LABELS,
               "q_features": BatchField("float", ("questions", "q_words", "features")),
               "q_mask": BatchField("bool", ("questions", "q_words")),
               "p_features": BatchField("float", ("paragraphs", "p_words", "features")),
               "p_mask": BatchField("bool", ("paragraphs", "p_words"))},
    # FCRR: the pooled per-source text vectors side by side.
    "fcrr": {**_LABELS,
             "q_features": BatchField("float", ("questions", "features")),
             "p_features": BatchField("float", ("paragraphs", "features"))},
}
"""The training batch of each tower (``embedding_core.training.task.BatchField``)."""

# Most padded word slots (rows x width) per call of the mixture or the tower: without a
# budget one long text costs batch_size times its own size. 64 texts of 512 words fit.
MAX_BATCH_WORDS = 64 * 512


@dataclasses.dataclass
class MultiResolutionTexts:
    """n texts' word matrices, ``vectors [n, d'']``, idf weights, ``is_empty [n]``."""

    word_matrices: list[np.ndarray]
    vectors: np.ndarray
    idf_weights: list[np.ndarray]
    is_empty: np.ndarray


def embed_texts(texts: Sequence[str], sources: Sequence[WordSource], idf_table: IdfTable,
                module: MultiResolutionEmbedding | None = None, *, batch_size: int = 128,
                max_batch_words: int | None = MAX_BATCH_WORDS) -> MultiResolutionTexts:
    """Sources, mixture, ensemble and pooling with fixed coefficients, ``max_batch_words`` a
    call; ValueError: a learning module, sources disagreeing on word counts."""
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
    """``f_mixture`` and pooling of one source (``mrwe_jax.features.cache.Mixture``)."""
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
    """``mrwe_jax.features.cache.build_features`` with the model's :func:`mixture`."""
    return word_features.build_features(config, corpus, mixture=mixture, use_cache=use_cache,
                                        specs=specs)


def load_corpus_of(config: ml_collections.ConfigDict) -> RetrievalCorpus:
    """The corpus and split ``config`` names (``squad_path``, ``split``, ...)."""
    corpus = load_corpus(config.squad_path or None, split=config.split,
                         test_fraction=float(config.test_fraction),
                         seed=int(config.split_seed), skip_invalid=bool(config.skip_invalid),
                         pairs_path=config.get("train_file") or None)
    logging.info("mrwe: %s", corpus.summary())
    if any(dataclasses.astuple(corpus.skips)):
        logging.warning("mrwe: skipped invalid SQuAD records: %s", corpus.skips)
    return corpus


def load_data(config: ml_collections.ConfigDict, *, use_cache: bool = True
              ) -> tuple[RetrievalCorpus, FeatureSet]:
    """The corpus and its features as ``config`` describes them (features cached on disk)."""
    corpus = load_corpus_of(config)
    return corpus, build_features(config, corpus, use_cache=use_cache)


def pool_indices(corpus: RetrievalCorpus, pool: str) -> np.ndarray:
    """``[n_pool]`` int64 paragraphs of the pool ``"all"`` or ``"test"``."""
    if pool == "test":
        return np.flatnonzero(corpus.test_pool)
    if pool == "all":
        return np.arange(len(corpus.paragraph_ids))
    raise ValueError(f"pool must be 'test' or 'all', got {pool!r}")


def ensemble_vectors(features: FeatureSet, side: str, names: Sequence[str] | None = None,
                     indices: np.ndarray | None = None) -> np.ndarray:
    """``[n, d'']`` float32 ``f_ensemble`` of pooled vectors (``names``: a subset)."""
    names = list(features.names if names is None else names)
    keep = [features.names.index(n) for n in names]
    u = normalized_weights(features.source_weights[keep], "source weights")
    feats = features.side(side)
    parts = [feats[n].vectors if indices is None else feats[n].vectors[indices] for n in names]
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        out = ensemble_sources([np.asarray(p) for p in parts], np.asarray(u),
                               features.source_aggregate)
    return np.asarray(out, np.float32)


def bucket_width(length: int, minimum: int = 16) -> int:
    """Padded word count: the next power of two from ``minimum`` (few compiled shapes)."""
    size = minimum
    while size < length:
        size *= 2
    return size


def batch_rows(width: int, batch_size: int, max_batch_words: int | None = MAX_BATCH_WORDS) -> int:
    """Rows of a batch of ``width`` words: ``batch_size``, or a power of two within
    ``max_batch_words``."""
    batch_size = int(batch_size)
    if not max_batch_words or batch_size * int(width) <= int(max_batch_words):
        return batch_size
    rows = 1
    while rows * 2 < batch_size and rows * 2 * int(width) <= int(max_batch_words):
        rows *= 2
    return rows


def side_arrays(features: FeatureSet, side: str, indices: np.ndarray, *, with_words: bool,
                width: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(features, mask)`` of one side's rows: word matrices and mask, or pooled vectors and
    None."""
    feats = features.side(side)
    indices = np.asarray(indices, np.int64)
    if not with_words:
        return np.concatenate([np.asarray(feats[n].vectors[indices], np.float32)
                               for n in features.names], axis=-1), None
    lengths = feats[features.names[0]].lengths[indices]
    if width is None:
        width = bucket_width(int(lengths.max(initial=1)))
    words = np.concatenate([feats[n].padded(indices, width) for n in features.names], axis=-1)
    return words, np.arange(width)[None, :] < lengths[:, None]


class PKBatches:
    """P x K batches of :data:`BATCH` (+ ``"step"``), a pure function of ``(seed, step)``;
    ValueError: no question, too few paragraphs, P or P*K not divisible by processes."""

    def __init__(self, features: FeatureSet, question_paragraph: np.ndarray,
                 train_questions: np.ndarray, *, P: int, K: int, seed: int, with_words: bool,
                 small_groups: str = "replace", max_paragraph_words: int = 0,
                 process_index: int = 0, process_count: int = 1) -> None:
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
        """This process's host batch of ``step``."""
        q = self.question_indices(step)
        p = self.question_paragraph[q[:: self.K]]  # group-major: one per group
        qs = _process_slice(q, self.process_index, self.process_count)
        ps = _process_slice(p, self.process_index, self.process_count)
        width = None
        if self.with_words:
            width = bucket_width(int(self.features.lengths("paragraphs")[p].max(initial=1)), 64)
            if self.max_paragraph_words:
                width = min(width, self.max_paragraph_words)
        q_x, q_mask = side_arrays(self.features, "questions", qs, with_words=self.with_words,
                                  width=self.question_width)
        p_x, p_mask = side_arrays(self.features, "paragraphs", ps, with_words=self.with_words,
                                  width=width)
        out = {"step": np.asarray(step, np.int64), "q_features": q_x, "p_features": p_x,
               "q_label": self.question_paragraph[qs].astype(np.int32),
               "p_label": ps.astype(np.int32)}
        if self.with_words:
            out.update(q_mask=q_mask, p_mask=p_mask)
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
