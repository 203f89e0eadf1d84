"""Each loss (value, and gradient with respect to the embeddings) equals
sentence-transformers 6.3's class on the same batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sentence_jax import losses

torch = pytest.importorskip("torch")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")


class _Given(torch.nn.Module):
    """A sentence-transformers module whose ``sentence_embedding`` is the column given."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, features):
        return {**features, "sentence_embedding": features["given"]}

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim


def _st_model(dim: int):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(modules=[_Given(dim)], device="cpu")


def _columns(n: int, columns: int, dim: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, dim)).astype(np.float32) for _ in range(columns)]


def _theirs(loss, columns, labels):
    given = [torch.tensor(c, requires_grad=True) for c in columns]
    value = loss([{"given": g} for g in given], torch.tensor(labels))
    value.backward()
    return float(value), [g.grad.numpy() for g in given]


def _ours(loss, columns, labels):
    def f(cols):
        return loss(cols, jnp.asarray(labels))

    value, grads = jax.value_and_grad(f)([jnp.asarray(c) for c in columns])
    return float(value), [np.asarray(g) for g in grads]


def _check(ours, theirs, columns, labels, tol=1e-5):
    v1, g1 = _ours(ours, columns, labels)
    v2, g2 = _theirs(theirs, columns, labels)
    assert abs(v1 - v2) <= tol * max(1.0, abs(v2)), (v1, v2)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, b, atol=tol, rtol=1e-4)


@pytest.mark.parametrize("columns", [2, 4])  # pairs; anchor, positive and 2 hard negatives
@pytest.mark.parametrize("kwargs", [
    {},
    {"scale": 1.0, "similarity_fct": "dot_score"},
    {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"},
    {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")},
])
def test_mnrl_equals_sentence_transformers(columns, kwargs):
    from sentence_transformers import util

    model = _st_model(16)
    fct = {"cos_sim": util.cos_sim, "dot_score": util.dot_score}[
        kwargs.get("similarity_fct", "cos_sim")]
    theirs = st_losses.MultipleNegativesRankingLoss(model, **{**kwargs, "similarity_fct": fct})
    cols = _columns(6, columns, 16)
    _check(losses.MultipleNegativesRankingLoss(**kwargs), theirs, cols, np.zeros(6, np.float32))


def test_symmetric_mnrl_equals_sentence_transformers():
    model = _st_model(8)
    _check(losses.MultipleNegativesSymmetricRankingLoss(),
           st_losses.MultipleNegativesSymmetricRankingLoss(model), _columns(5, 2, 8),
           np.zeros(5, np.float32))


def test_cached_mnrl_has_mnrl_value_and_gradient():
    """The cached loss's value on embeddings is MNRL's (GradCache changes how the trainer
    gets the gradient through the encoder, not the loss)."""
    model = _st_model(8)
    _check(losses.CachedMultipleNegativesRankingLoss(mini_batch_size=2),
           st_losses.MultipleNegativesRankingLoss(model), _columns(6, 3, 8),
           np.zeros(6, np.float32))


@pytest.mark.parametrize("labels", [
    np.array([0.1, 0.9, 0.5, 0.5, 0.0, 1.0], np.float32),  # with a tie
    np.array([1, 0, 1, 1, 0, 0], np.float32),
])
def test_cosent_equals_sentence_transformers(labels):
    model = _st_model(8)
    _check(losses.CoSENTLoss(), st_losses.CoSENTLoss(model), _columns(6, 2, 8, seed=3), labels)


@pytest.mark.parametrize("inner,columns", [("mnrl", 4), ("cosent", 2)])
def test_matryoshka_over_3_dims_equals_sentence_transformers(inner, columns):
    model = _st_model(16)
    dims, weights = [4, 16, 8], [0.5, 1.0, 2.0]  # unsorted: both sort them, largest first
    ours_inner, theirs_inner = {
        "mnrl": (losses.MultipleNegativesRankingLoss(),
                 st_losses.MultipleNegativesRankingLoss(model)),
        "cosent": (losses.CoSENTLoss(), st_losses.CoSENTLoss(model))}[inner]
    labels = np.array([0.2, 0.8, 0.4, 0.9, 0.1, 0.6], np.float32)
    ours = losses.MatryoshkaLoss(ours_inner, dims, weights)
    assert ours.matryoshka_dims == (16, 8, 4) and ours.matryoshka_weights == (1.0, 2.0, 0.5)
    _check(ours, st_losses.MatryoshkaLoss(model, theirs_inner, dims, weights),
           _columns(6, columns, 16, seed=1), labels)


def test_matryoshka_n_dims_per_step_sums_the_drawn_dims():
    inner = losses.MultipleNegativesRankingLoss()
    loss = losses.MatryoshkaLoss(inner, (8, 4, 2), n_dims_per_step=2)
    cols = [jnp.asarray(c) for c in _columns(4, 2, 8)]
    each = {d: float(inner([losses.shrink(c, d) for c in cols])) for d in (8, 4, 2)}
    drawn = set()
    for seed in range(12):
        value = float(loss(cols, None, jax.random.key(seed)))
        pair = [p for p in [(8, 4), (8, 2), (4, 2)] if abs(each[p[0]] + each[p[1]] - value) < 1e-5]
        assert len(pair) == 1, (value, each)
        drawn.add(pair[0])
    assert len(drawn) > 1  # the draw changes with the key


@pytest.mark.parametrize("make,error", [
    (lambda: losses.MultipleNegativesRankingLoss(scale=0), "scale=0: must be positive"),
    (lambda: losses.MultipleNegativesRankingLoss(similarity_fct="cosine"),
     "similarity_fct='cosine': one of cos_sim, dot_score"),
    (lambda: losses.MultipleNegativesRankingLoss(directions=("query_to_query", "query_to_doc"),
                                                 partition_mode="per_direction"),
     "partition_mode='per_direction' takes only"),
    (lambda: losses.MatryoshkaLoss(losses.CoSENTLoss(), (8, 4), (1.0,)),
     "matryoshka_weights has 1 entries for 2 matryoshka_dims"),
    (lambda: losses.MatryoshkaLoss(losses.CoSENTLoss(), (8, 0)), "give positive dimensions"),
])
def test_bad_arguments_are_one_line(make, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        make()
