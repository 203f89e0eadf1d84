"""mrwe_jax: the IDF switch (config.word_weights) and the default evaluation pool."""

import math

import numpy as np
import pytest

from data_pipelines.retrieval_corpus import RetrievalCorpus
from data_pipelines.squad import SquadSkips
from mrwe_jax import data, evaluate
from mrwe_jax.configs import default
from mrwe_jax.features.cache import SourceSpec, idf_fingerprint, word_weight_table
from mrwe_jax.features.sources import IdfTable, tokenize_words

# Two layers of width 2 per word; with m = (1/2, 1/2) and the layer sum the mixture is
# a -> (2, 0), b -> (0, 3), c -> (1, 1).
LAYERS = {"a": [[1.0, 0.0], [3.0, 0.0]], "b": [[0.0, 2.0], [0.0, 4.0]],
          "c": [[1.0, 1.0], [1.0, 1.0]]}
MIX = {"a": [2.0, 0.0], "b": [0.0, 3.0], "c": [1.0, 1.0]}


class ToySource:
    name, num_layers, dim = "toy", 2, 2

    def layer_tensors(self, texts):
        return [np.array([LAYERS[w] for w in tokenize_words(t)], np.float32).reshape(-1, 2, 2)
                for t in texts]


def toy_corpus():
    paragraphs = ["a b", "a c"]  # idf: a = ln(2/2) = 0, b = c = ln 2
    questions = ["b", "a c c", "a"]
    return RetrievalCorpus(
        paragraph_ids=["p0", "p1"], paragraph_texts=paragraphs,
        paragraph_article=np.array([0, 1]), question_ids=["q0", "q1", "q2"],
        question_texts=questions, question_paragraph=np.array([0, 1, 1]),
        train_questions=np.array([True, False, False]),
        test_questions=np.array([False, True, True]),
        train_paragraphs=np.array([True, False]), test_pool=np.array([False, True]),
        split="articles", source="toy", skips=SquadSkips())


def toy_config(word_weights):
    c = default.get_config()
    c.word_weights = word_weights
    return c


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EMBEDDING_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
    spec = SourceSpec("toy", 2, (0.5, 0.5), "toy|v1", ToySource)
    corpus = toy_corpus()
    # IDF first, through the same cache: the unit build must not reuse its entries.
    out = {w: data.build_features(toy_config(w), corpus, specs=[spec])
           for w in ("idf", "unit")}
    mp.undo()
    return out


def test_unit_switch_gives_weight_one_and_the_plain_layer_mixture(features):
    unit = features["unit"]
    assert unit.idf_table.unit
    np.testing.assert_array_equal(unit.idf_table.weights(["a", "b", "never-seen"]), 1.0)
    for side, texts in (("paragraphs", ["a b", "a c"]), ("questions", ["b", "a c c", "a"])):
        feats = unit.side(side)["toy"]
        for i, text in enumerate(texts):
            words = np.array([MIX[w] for w in text.split()])
            np.testing.assert_allclose(feats.words[feats.offsets[i]:feats.offsets[i + 1]],
                                       words, rtol=1e-6)
            np.testing.assert_allclose(feats.vectors[i], words.mean(0), rtol=1e-6)


def test_idf_switch_weights_each_word_by_ln_n_over_df(features):
    ln2 = math.log(2)
    feats = features["idf"].questions["toy"]
    # "a c c": a has idf 0, c has ln 2 -> mean of (0, 0), (ln2, ln2), (ln2, ln2).
    np.testing.assert_allclose(feats.vectors[1], [2 * ln2 / 3, 2 * ln2 / 3], rtol=1e-6)
    np.testing.assert_allclose(feats.vectors[2], [0.0, 0.0], atol=1e-7)
    assert idf_fingerprint(features["idf"].idf_table) != idf_fingerprint(
        features["unit"].idf_table)


def test_unit_table_round_trips_and_bad_values_are_refused():
    table = IdfTable.from_json(IdfTable.unit_weights(7).to_json())
    assert table.unit and table.num_documents == 7 and len(table) == 0
    plain = IdfTable.from_json(IdfTable({"a": 0.5}, 2).to_json())
    assert not plain.unit and "unit" not in IdfTable({"a": 0.5}, 2).to_json()
    with pytest.raises(ValueError, match="unit"):
        IdfTable.from_json({"format": "mrwe idf v1", "num_documents": 1, "idf": {},
                            "unit": "yes"}, "x.json")
    with pytest.raises(ValueError, match="word_weights"):
        word_weight_table(toy_config("none"), ["a"])
    config = toy_config("none")
    with pytest.raises(ValueError, match="word_weights"):
        default.validate_config(config)


def test_default_pool_is_every_paragraph():
    corpus = toy_corpus()
    assert default.get_config().eval_pool == "all"
    np.testing.assert_array_equal(evaluate.pool_indices(corpus, "all"), [0, 1])
    np.testing.assert_array_equal(evaluate.pool_indices(corpus, "test"), [1])
