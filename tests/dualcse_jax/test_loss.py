"""The DualCSE 5-term loss against a plain numpy transcription of the paper's equation."""

import itertools

import numpy as np
import pytest

from dualcse_jax.loss import dualcse_loss, simcse_loss

TAU = 0.05


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _v(a, b):
    return np.exp(_cos(a, b) / TAU)


def reference_loss(r, u, use_contradiction=True, use_intra=True):
    """Literal loops over the equation in docs/dualcse.md (no masking)."""
    n = r.shape[0]
    rp, up = r[:, 0], u[:, 0]
    r1, u1 = r[:, 1], u[:, 1]
    r2, u2 = r[:, 2], u[:, 2]
    rn, un = r[:, 3], u[:, 3]
    total = 0.0
    for i in range(n):
        d1 = sum(_v(rp[i], r1[j]) + (_v(rp[i], rn[j]) if use_contradiction else 0.0)
                 + (_v(rp[i], up[j]) if use_intra else 0.0) for j in range(n))
        d2 = sum(_v(up[i], r2[j]) + (_v(up[i], rn[j]) if use_contradiction else 0.0)
                 + (_v(up[i], rp[j]) if use_intra else 0.0) for j in range(n))
        li = -np.log(_v(rp[i], r1[i]) / d1) - np.log(_v(up[i], r2[i]) / d2)
        if use_intra:
            li += -np.log(_v(r1[i], u1[i]) / sum(_v(r1[i], u1[j]) for j in range(n)))
            li += -np.log(_v(r2[i], u2[i]) / sum(_v(r2[i], u2[j]) for j in range(n)))
            if use_contradiction:
                li += -np.log(_v(rn[i], un[i]) / sum(_v(rn[i], un[j]) for j in range(n)))
        total += li
    return total / n


@pytest.mark.parametrize("use_contradiction,use_intra",
                         list(itertools.product([True, False], [True, False])))
def test_dualcse_loss_equals_numpy_reference(use_contradiction, use_intra):
    rng = np.random.default_rng(0)
    n, d = 6, 16
    r = rng.normal(size=(n, 4, d)).astype(np.float32)
    u = rng.normal(size=(n, 4, d)).astype(np.float32)
    ids = np.arange(n * 4, dtype=np.int32).reshape(n, 4)  # all texts distinct
    got, terms = dualcse_loss(r, u, ids, temperature=TAU, use_contradiction=use_contradiction,
                              use_intra=use_intra)
    want = reference_loss(r.astype(np.float64), u.astype(np.float64),
                          use_contradiction, use_intra)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    expected_terms = 2 + (2 + use_contradiction if use_intra else 0)
    assert len(terms) == expected_terms


def test_duplicate_of_positive_is_not_a_negative():
    """Premise 1's explicit hypothesis repeats premise 0's: it must leave 0's denominator."""
    rng = np.random.default_rng(1)
    n, d = 4, 8
    r = rng.normal(size=(n, 4, d)).astype(np.float32)
    u = rng.normal(size=(n, 4, d)).astype(np.float32)
    ids = np.arange(n * 4, dtype=np.int32).reshape(n, 4)
    r[0, 1] = r[0, 0] + 0.1 * r[0, 1]  # a confident positive, so its copy matters
    r[1, 1] = r[0, 1]
    u[1, 1] = u[0, 1]
    ids[1, 1] = ids[0, 1]
    got, terms = dualcse_loss(r, u, ids, temperature=TAU)
    # Term 1 of premise 0 by hand, with key j=1 of the explicit block removed.
    rp, r1, rn, up = r[:, 0], r[:, 1], r[:, 3], u[:, 0]
    denom0 = (sum(_v(rp[0], r1[j]) for j in range(n) if j != 1)
              + sum(_v(rp[0], rn[j]) + _v(rp[0], up[j]) for j in range(n)))
    term1_0 = -np.log(_v(rp[0], r1[0]) / denom0)
    denom1 = (sum(_v(rp[1], r1[j]) for j in range(n) if j != 0)
              + sum(_v(rp[1], rn[j]) + _v(rp[1], up[j]) for j in range(n)))
    term1_1 = -np.log(_v(rp[1], r1[1]) / denom1)
    rest = [-np.log(_v(rp[i], r1[i]) / sum(_v(rp[i], r1[j]) + _v(rp[i], rn[j])
                                            + _v(rp[i], up[j]) for j in range(n)))
            for i in (2, 3)]
    np.testing.assert_allclose(float(terms["term1"]), (term1_0 + term1_1 + sum(rest)) / n,
                               rtol=1e-5)
    # And the unmasked loss differs, so the mask is doing something.
    unmasked, _ = dualcse_loss(r, u, np.arange(n * 4).reshape(n, 4), temperature=TAU)
    assert float(unmasked) - float(got) > 0.1


def test_simcse_loss_equals_reference():
    rng = np.random.default_rng(2)
    n, d = 5, 8
    e = rng.normal(size=(n, 3, d)).astype(np.float32)
    ids = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
    got, _ = simcse_loss(e, ids, temperature=TAU)
    want = np.mean([
        -np.log(_v(e[i, 0], e[i, 1]) / sum(_v(e[i, 0], e[j, 1]) + _v(e[i, 0], e[j, 2])
                                            for j in range(n)))
        for i in range(n)])
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
