"""RTE score rules: the two-threshold tuner against brute force, each rule on hand-worked
scores, the similarities read from r and u, and the evaluate path reporting every rule."""

from __future__ import annotations

import itertools
import json
import types

import numpy as np
import pytest

from data_pipelines.inli import INLIExample
from dualcse_jax import evaluate
from dualcse_jax.configs import RTE_SCORE_RULES, default


def _cuts(values):
    u = np.unique(values)
    return [-np.inf, *((u[:-1] + u[1:]) / 2), np.inf]


def test_pair_tuner_equals_brute_force_with_ties():
    rng = np.random.default_rng(0)
    for trial in range(5):
        n = 40
        s_r = np.round(rng.normal(size=n), 1)  # rounded: many tied scores
        s_u = np.round(rng.normal(size=n), 1)
        y = rng.random(n) < 0.5
        best, arg = -1.0, None
        for t_r, t_u in itertools.product(_cuts(s_r), _cuts(s_u)):  # lexicographic order
            acc = np.mean(((s_r > t_r) | (s_u > t_u)) == y)
            if acc > best:
                best, arg = acc, (t_r, t_u)
        t_r, t_u, acc = evaluate.best_threshold_pair_accuracy(s_r, s_u, y, chunk=7)
        assert acc == pytest.approx(best), trial
        assert np.mean(((s_r > t_r) | (s_u > t_u)) == y) == pytest.approx(acc)
        assert (t_r, t_u) == pytest.approx(arg)  # smallest t_r, then smallest t_u


def test_pair_tuner_hand_worked():
    # Entailed: A (r high) and B (u high); not entailed: C (r middling), D (u middling).
    s_r = [0.9, 0.0, 0.7, 0.0]
    s_u = [0.0, 0.5, 0.0, 0.3]
    y = [True, True, False, False]
    assert evaluate.best_threshold_pair_accuracy(s_r, s_u, y) == pytest.approx((0.8, 0.4, 1.0))
    with pytest.raises(ValueError, match="NaN"):
        evaluate.best_threshold_pair_accuracy([np.nan], [0.0], [True])


# Val: one pair per class (columns cos(r_p, r_h), cos(u_p, r_h)); the hand-worked thresholds:
# max -> 0.4 (3 of 4; ties with 0.8, the smaller wins), explicit -> 0.8 (3 of 4),
# implicit -> 0.4 (3 of 4), pair -> (0.8, 0.4) (4 of 4).
VAL = {"explicit": [[0.9, 0.0]], "implied": [[0.0, 0.5]], "neutral": [[0.7, 0.0]],
       "contradiction": [[0.0, 0.3]]}
TEST = {"explicit": [[0.85, 0.1], [0.75, 0.0]], "implied": [[0.0, 0.45], [0.2, 0.35]],
        "neutral": [[0.6, 0.1], [0.82, 0.0]], "contradiction": [[0.1, 0.2], [0.0, 0.41]]}
WANT = {  # per rule: thresholds, then correctness of each test pair by hand
    "max": ((0.4,), {"explicit": [1, 1], "implied": [1, 0], "neutral": [0, 0],
                     "contradiction": [1, 0]}),
    "explicit": ((0.8,), {"explicit": [1, 0], "implied": [0, 0], "neutral": [1, 0],
                          "contradiction": [1, 1]}),
    "implicit": ((0.4,), {"explicit": [0, 0], "implied": [1, 0], "neutral": [1, 1],
                          "contradiction": [1, 0]}),
    "pair": ((0.8, 0.4), {"explicit": [1, 0], "implied": [1, 0], "neutral": [1, 0],
                          "contradiction": [1, 0]}),
}


@pytest.mark.parametrize("rule", RTE_SCORE_RULES)
def test_each_rule_on_hand_worked_scores(rule):
    val = {c: np.asarray(v, np.float32) for c, v in VAL.items()}
    test = {c: np.asarray(v, np.float32) for c, v in TEST.items()}
    thresholds, correct = WANT[rule]
    got, t = evaluate.rte_correct(val, test, rule)
    assert t == pytest.approx(thresholds)
    assert {c: v.astype(int).tolist() for c, v in got.items()} == correct
    result = evaluate.rte_result(val, test, rule)
    assert result["average"] == pytest.approx(np.mean([np.mean(v) for v in correct.values()]))
    assert ("threshold_implicit" in result) == (rule == "pair")
    assert ("auc" in result) == (rule != "pair")  # no single score under pair


def test_threshold_free_measures_hand_worked():
    test = {c: np.asarray(v, np.float32) for c, v in TEST.items()}
    got = evaluate.threshold_free(test, "implicit")
    # implied (u: .45, .35) against every not-entailed pair (.1, 0, .2, .41): .45 beats 4,
    # .35 beats 3 -> AUC 7/8; ranked .45+ .41- .35+: AP (1/1 + 2/3) / 2.
    assert got["auc"]["implied"] == pytest.approx(7 / 8)
    assert got["ap"]["implied"] == pytest.approx((1 + 2 / 3) / 2)
    # all: explicit (.1, 0) and implied entailed; ties (.1 = .1, 0 = 0) count one half:
    # 1.5 + 0.5 + 4 + 3 = 9 of 16.
    assert got["auc"]["all"] == pytest.approx(9 / 16)
    assert evaluate.threshold_free(test, "pair") == {}
    table = evaluate.format_rte_table({"m": evaluate.rte_result(
        {c: np.asarray(v, np.float32) for c, v in VAL.items()}, test, "implicit")})
    assert "ROC-AUC" in table and "87.50" in table and "56.25" in table


def test_unknown_rule_is_refused_and_the_flag_parses():
    with pytest.raises(ValueError, match="'sum'.*max, explicit, implicit, pair"):
        evaluate.check_rule("sum")
    assert evaluate.parse_rules("all") == list(RTE_SCORE_RULES)
    assert evaluate.parse_rules(" pair, max ") == ["pair", "max"]
    assert evaluate.parse_rules(None) is None and evaluate.parse_rules(" ") is None
    with pytest.raises(ValueError, match="'maxx'"):
        evaluate.parse_rules("max,maxx")
    config = default.get_config()
    config.eval_rte_score_rule = "u"
    with pytest.raises(ValueError, match="config.eval_rte_score_rule='u'"):
        default.validate(config)


class FakeEmbedder:
    """Fixed r and u per text; a one-vector model when ``simcse``."""

    def __init__(self, vectors, architecture="cross", rule="max"):
        self.vectors = vectors
        self.model = types.SimpleNamespace(architecture=architecture)
        self.params = None
        self.step = 7
        self.config = default.get_config()
        self.config.architecture = architecture
        self.config.eval_rte_score_rule = rule

    def encode(self, texts, kind="explicit", **_):
        col = 0 if kind == "explicit" or self.model.architecture == "simcse" else 1
        return np.asarray([self.vectors[t][col] for t in texts], np.float32)


def _example(i):
    return INLIExample(premise=f"p{i}", explicit_entailment=f"e{i}",
                       implied_entailment=f"i{i}", neutral=f"n{i}",
                       contradiction=f"c{i}", dataset="test", line=i + 2)


def _vectors(n, seed):
    rng = np.random.default_rng(seed)
    return {f"{k}{i}": (rng.normal(size=3), rng.normal(size=3))
            for i in range(n) for k in "peinc"}


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_similarities_read_r_and_u_of_the_premise_and_r_of_the_hypothesis():
    vectors = _vectors(3, 1)
    sims = evaluate.rte_similarities(FakeEmbedder(vectors), [_example(i) for i in range(3)])
    r_p, u_p = vectors["p1"]
    r_h = vectors["i1"][0]
    np.testing.assert_allclose(sims["implied"][1], [_cos(r_p, r_h), _cos(u_p, r_h)],
                               rtol=1e-5)
    one = evaluate.rte_similarities(FakeEmbedder(vectors, "simcse"), [_example(0)])
    assert one["neutral"][0, 0] == one["neutral"][0, 1]  # r = u: both columns equal


def test_eis_proxy_from_rte_vectors_equals_encoding_the_pairs():
    examples = [_example(i) for i in range(6)]
    fake = FakeEmbedder(_vectors(6, 3))
    vectors = evaluate.encode_rte(fake, examples)
    got = evaluate.inli_eis_proxy_correct(fake, examples, vectors)
    want = evaluate.eis_correct(fake, evaluate.inli_eis_proxy_pairs(examples))
    np.testing.assert_array_equal(got, want)
    assert 0 < want.sum() < 6  # both outcomes occur
    assert evaluate.inli_eis_proxy_pairs(examples)[2] == ("p2", "i2")  # implied entailment
    # A one-vector model: implicitness exactly 0 (not 1 - cos(r, r) rounding), all ties.
    one = FakeEmbedder(_vectors(6, 3), "simcse")
    assert not evaluate.inli_eis_proxy_correct(one, examples,
                                               evaluate.encode_rte(one, examples)).any()
    assert not evaluate.eis_correct(one, evaluate.inli_eis_proxy_pairs(examples)).any()
    assert (evaluate.implicitness(one, ["p0", "e3"]) == 0).all()


def test_evaluate_rte_follows_the_config_rule_and_workdir_reports_every_rule(
        tmp_path, monkeypatch):
    from dualcse_jax import data, inference, workflows

    val, test = [_example(i) for i in range(8)], [_example(i) for i in range(8, 16)]
    fake = FakeEmbedder(_vectors(16, 2), rule="pair")
    assert "threshold_implicit" in evaluate.evaluate_rte(fake, val, test)
    monkeypatch.setattr(data, "val_examples", lambda config: val)
    monkeypatch.setattr(data, "test_examples", lambda config: test)
    monkeypatch.setattr(inference, "read_config",
                        lambda workdir: fake.config.copy_and_resolve_references())
    monkeypatch.setattr(inference, "load", lambda workdir, step=None: fake)
    out = workflows.evaluate_workdir(tmp_path, progress=False, rules=list(RTE_SCORE_RULES))
    saved = json.loads((tmp_path / "eval" / "rte.json").read_text())
    assert saved["rule"] == "max" and set(saved["rules"]) == set(RTE_SCORE_RULES)
    by_rule = {r: evaluate.evaluate_rte(fake, val, test, rule=r) for r in RTE_SCORE_RULES}
    for rule in RTE_SCORE_RULES:
        assert saved["rules"][rule]["average"] == pytest.approx(by_rule[rule]["average"])
        assert out["rte_rules"][rule]["average"] == pytest.approx(by_rule[rule]["average"])
    eis = json.loads((tmp_path / "eval" / "eis.json").read_text())
    assert eis["proxy"] is True and eis["eis_data"].startswith("INLI test: premise")
    with pytest.raises(ValueError, match="'sum'"):
        workflows.evaluate_workdir(tmp_path, progress=False, rules=["sum"])
    # A user's test file is named as such, never "INLI"; a one-vector model has no EIS.
    fake.config.test_file = "/data/my_test.csv"
    workflows.evaluate_workdir(tmp_path, progress=False)
    eis = json.loads((tmp_path / "eval" / "eis.json").read_text())
    assert eis["eis_data"].startswith("/data/my_test.csv: premise") and "INLI" not in \
        eis["eis_data"]
    one = FakeEmbedder(_vectors(16, 2), architecture="simcse")
    monkeypatch.setattr(inference, "load", lambda workdir, step=None: one)
    workflows.evaluate_workdir(tmp_path, progress=False)
    eis = json.loads((tmp_path / "eval" / "eis.json").read_text())
    assert eis["eis_accuracy"] is None and eis["eis_data"].startswith("n/a (one vector")
