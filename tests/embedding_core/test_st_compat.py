"""sentence-transformers' encode arguments on the Encoder base: quantization and
similarities equal to sentence-transformers' own, prompts, truncation, tensors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from embedding_core.serving import st_compat
from embedding_core.serving.inference import Encoder


@pytest.mark.parametrize("precision", st_compat.PRECISIONS)
def test_quantize_equals_sentence_transformers(precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    rng = np.random.default_rng(0)
    x = rng.normal(size=(13, 37)).astype(np.float32)
    x[:, 3] = 0.25  # a constant dimension: a zero step
    calibration = rng.normal(size=(50, 37)).astype(np.float32)
    ours = st_compat.quantize(x, precision)
    theirs = quantize_embeddings(x, precision=precision)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    if precision.endswith("int8"):
        assert np.array_equal(
            st_compat.quantize(x, precision, calibration_embeddings=calibration),
            quantize_embeddings(x, precision=precision, calibration_embeddings=calibration))


@pytest.mark.parametrize("fn", st_compat.SIMILARITY_FNS)
def test_similarities_equal_sentence_transformers(fn):
    import torch
    from sentence_transformers import SimilarityFunction

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4, 9)), rng.normal(size=(6, 9))
    flipped = np.ascontiguousarray(a[::-1])
    ref = SimilarityFunction.to_similarity_fn(fn)(torch.tensor(a), torch.tensor(b)).numpy()
    np.testing.assert_allclose(st_compat.similarity(a, b, fn), ref, rtol=1e-5, atol=1e-5)
    pair = SimilarityFunction.to_similarity_pairwise_fn(fn)(torch.tensor(a), torch.tensor(flipped))
    np.testing.assert_allclose(st_compat.similarity_pairwise(a, flipped, fn), pair.numpy(),
                               rtol=1e-5, atol=1e-5)


class _Letters(Encoder):
    """Row = counts of a, b, c, d and the length: hand-checkable vectors."""

    name = "letters"
    prompts = {"query": "a: ", "passage": "dd "}

    @property
    def dim(self) -> int:
        return 5

    def _encode(self, texts, *, batch_size, show_progress_bar):
        return np.array([[t.count(c) for c in "abcd"] + [len(t)] for t in texts], np.float32)


def test_encode_takes_sentence_transformers_arguments():
    enc = _Letters()
    assert enc.encode("abba").tolist() == [2, 2, 0, 0, 4]  # one string: one row
    assert enc.encode(["c"], prompt_name="query").tolist() == [[1, 0, 1, 0, 4]]
    assert enc.encode(["c"], prompt="bb ", prompt_name="query").tolist() == [[0, 2, 1, 0, 4]]
    assert enc.encode_query(["c"]).tolist() == [[1, 0, 1, 0, 4]]
    assert enc.encode_document(["c"]).tolist() == [[0, 0, 1, 2, 4]]  # "passage"
    # Truncated to 2 dims, then normalized: (3, 4) -> (0.6, 0.8).
    out = enc.encode(["aaabbbb"], truncate_dim=2, normalize_embeddings=True)
    np.testing.assert_allclose(out, [[0.6, 0.8]], rtol=1e-6)
    assert enc.get_sentence_embedding_dimension() == 5
    tensor = enc.encode(["ab", "c"], convert_to_tensor=True, device="cpu")
    assert isinstance(tensor, jax.Array) and tensor.shape == (2, 5)
    assert tensor.devices() == {jax.devices("cpu")[0]}
    listed = enc.encode(["ab", "c"], convert_to_numpy=False)
    assert isinstance(listed, list) and [v.shape for v in listed] == [(5,), (5,)]
    assert enc.encode(["ab", "dcb"], precision="ubinary").tolist() == [[0b11001000], [0b01111000]]
    np.testing.assert_allclose(enc.similarity(enc.encode(["ab"]), enc.encode(["ab", "cd"])),
                               [[1.0, 2 / 3]], rtol=1e-6)
    with pytest.raises(ValueError, match="prompt_name 'doc' is not one of"):
        enc.encode(["x"], prompt_name="doc")
    with pytest.raises(ValueError, match="precision 'int4'"):
        enc.encode(["x"], precision="int4")
    with pytest.raises(ValueError, match="device 'tpu'"):
        enc.encode(["x"], device="tpu")
    with pytest.raises(ValueError, match="sentence embeddings only"):
        enc.encode(["x"], output_value="token_embeddings")
