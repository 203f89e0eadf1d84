"""A ``tokenizers.Tokenizer`` called as transformers' tokenizers are (``tok("hi")``,
``tok(["a", "b"], padding=True, return_tensors="np")``), without transformers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Encoded(dict):
    """Keys also as attributes (``enc.input_ids``), as transformers' ``BatchEncoding``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _texts(value: Any, name: str) -> list[str]:
    """``value`` (a str or a sequence of them) as a list. Raises TypeError."""
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, (bytes, bytearray, dict)) or not hasattr(
            value, "__iter__"):
        raise TypeError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] is a {type(item).__name__}, not a str")
    return items


class CallableTokenizer:
    """``backend`` called as a transformers tokenizer."""

    def __init__(self, backend: Any, *, model_max_length: int, token_types: bool,
                 pad_token_id: int) -> None:
        self.backend_tokenizer = backend
        self.model_max_length = int(model_max_length)
        self.pad_token_id = int(pad_token_id)
        self.model_input_names = (["input_ids", "token_type_ids", "attention_mask"]
                                  if token_types else ["input_ids", "attention_mask"])

    def __call__(self, text: str | Sequence[str],
                 text_pair: str | Sequence[str] | None = None, *,
                 add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | str = False, max_length: int | None = None,
                 return_tensors: str | None = None) -> Encoded:
        """``model_input_names`` -> lists of ints per text (``np``: int64 ``[n, L]``).
        Raises ValueError: ``return_tensors`` not None / ``"np"``, or ``"np"`` on texts of
        different lengths without ``padding``."""
        single = isinstance(text, str)
        texts = _texts(text, "text")
        pairs = None if text_pair is None else _texts(text_pair, "text_pair")
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors={return_tensors!r}: this tokenizer gives lists "
                             "or numpy arrays (None or 'np'); it needs no torch")
        limit = int(max_length or self.model_max_length)
        inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
        if truncation:
            self.backend_tokenizer.enable_truncation(max_length=limit)
        try:
            encodings = self.backend_tokenizer.encode_batch(
                inputs, add_special_tokens=add_special_tokens)
        finally:
            self.backend_tokenizer.no_truncation()
        rows = {"input_ids": [e.ids for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings],
                "attention_mask": [[1] * len(e.ids) for e in encodings]}
        if padding:
            width = limit if padding == "max_length" else \
                max(map(len, rows["input_ids"]), default=0)
            fill = {"input_ids": self.pad_token_id, "token_type_ids": 0, "attention_mask": 0}
            rows = {k: [r + [fill[k]] * (width - len(r)) for r in v] for k, v in rows.items()}
        out = Encoded((k, rows[k]) for k in self.model_input_names)
        if return_tensors == "np":
            if len({len(r) for r in out["input_ids"]}) > 1:
                raise ValueError("texts of different lengths make no array: pass padding=True")
            out = Encoded((k, np.asarray(v, np.int64).reshape(len(v), -1) if v else
                           np.zeros((0, 0), np.int64)) for k, v in out.items())
        return Encoded((k, v[0]) for k, v in out.items()) if single else out

    def encode(self, text: str, text_pair: str | None = None, *,
               add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, text_pair,
                                             add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(map(int, ids)),
                                             skip_special_tokens=skip_special_tokens)

    def tokenize(self, text: str) -> list[str]:
        return self.backend_tokenizer.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int] | None:
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str] | None:
        if isinstance(ids, (int, np.integer)):
            return self.backend_tokenizer.id_to_token(int(ids))
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, "
                f"model_max_length={self.model_max_length}, "
                f"model_input_names={self.model_input_names})")
