"""SimCSE(INLI)'s two rows per premise: a sibling row's entailment is masked, not a negative."""

from __future__ import annotations

import functools

import jax
import numpy as np

from dualcse_jax import loss

TAU = 0.05
# One compiled program per batch shape instead of one per eager op.
simcse_loss = jax.jit(functools.partial(loss.simcse_loss, temperature=TAU))


def _v(a, b):
    return np.exp(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) / TAU)


def reference_rows(e, ids):
    """Literal loop, one loss per row: row i's sum runs over every positive and hard
    negative except the positives of other rows with i's anchor identity, copies of i's
    own positive, and hard negatives that are no negatives (a copy of i's positive, or of
    their own row's positive)."""
    n = e.shape[0]
    out = []
    for i in range(n):
        denom = 0.0
        for j in range(n):
            sibling = j != i and ids[j, 0] == ids[i, 0]
            copy = j != i and ids[j, 1] == ids[i, 1]
            if not (sibling or copy):
                denom += _v(e[i, 0], e[j, 1])
            if ids[j, 2] != ids[i, 1] and ids[j, 2] != ids[j, 1]:
                denom += _v(e[i, 0], e[j, 2])
        out.append(-np.log(_v(e[i, 0], e[i, 1]) / denom))
    return out


def reference(e, ids):
    return float(np.mean(reference_rows(e, ids)))


def _batch(seed=3, n=5, d=8):
    """Rows 0 and 1 are the explicit- and implied-entailment rows of one premise (same
    anchor text and vector, same contradiction); rows 2-4 are other premises. Row 1's
    positive is close to the premise, so pushing row 0 away from it would cost."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(n, 3, d)).astype(np.float32)
    ids = np.arange(n * 3, dtype=np.int32).reshape(n, 3)
    e[1, 0], ids[1, 0] = e[0, 0], ids[0, 0]
    e[1, 2], ids[1, 2] = e[0, 2], ids[0, 2]
    e[0, 1] = e[0, 0] + 0.3 * e[0, 1]
    e[1, 1] = e[0, 0] + 0.3 * e[1, 1]
    return e, ids


def test_sibling_entailment_leaves_the_denominator():
    e, ids = _batch()
    e64 = e.astype(np.float64)
    # Row 0 by hand: its sum skips key 1 of the positive block (the sibling's entailment)
    # and keeps both copies of the shared contradiction.
    denom0 = (sum(_v(e64[0, 0], e64[j, 1]) for j in (0, 2, 3, 4))
              + sum(_v(e64[0, 0], e64[j, 2]) for j in range(5)))
    np.testing.assert_allclose(reference_rows(e64, ids)[0],
                               -np.log(_v(e64[0, 0], e64[0, 1]) / denom0), rtol=1e-12)
    got, _ = simcse_loss(e, ids)
    np.testing.assert_allclose(float(got), reference(e64, ids), rtol=1e-5)
    # The same batch without the shared anchor identity pushes the sibling away: a larger
    # loss, so the mask does change the value.
    unmasked_ids = ids.copy()
    unmasked_ids[1, 0] = 99
    plain, _ = simcse_loss(e, unmasked_ids)
    np.testing.assert_allclose(float(plain), reference(e64, unmasked_ids), rtol=1e-5)
    assert float(plain) - float(got) > 0.1


def test_inli_table_marks_siblings_by_anchor_identity(minilm_dir):
    from data_pipelines import inli
    from data_pipelines.tokenization import load_tokenizer
    from dualcse_jax import tables as dualcse_data

    rows = inli.read_inli(inli.inli_split_path("val"))[:3]
    table = dualcse_data.simcse_table_from_inli(rows, load_tokenizer(minilm_dir), 32)
    anchor = table.text_ids[:, dualcse_data.SIMCSE_SENTENCES.index("anchor")]
    assert anchor[0] == anchor[1] != anchor[2] == anchor[3] != anchor[4] == anchor[5]
    rng = np.random.default_rng(4)
    e = rng.normal(size=(6, 3, 8)).astype(np.float32)
    got, _ = simcse_loss(e, table.text_ids)
    np.testing.assert_allclose(float(got), reference(e.astype(np.float64), table.text_ids),
                               rtol=1e-5)
