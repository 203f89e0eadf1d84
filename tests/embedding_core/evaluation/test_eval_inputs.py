"""Bad evaluation inputs end in one line before any model loads, and results never
overwrite each other."""

from __future__ import annotations

import json

import pytest

from embedding_core.errors import DataError
from embedding_core.evaluation import cli, pairs, retrieval, run


def test_degenerate_files_are_refused_with_their_name(tmp_path):
    same = tmp_path / "same.csv"
    same.write_text("sentence1,sentence2,score\na,b,3\nc,d,3\n")
    with pytest.raises(DataError, match="same.csv: field 'score': 2 row.*two"):
        pairs.EmbeddingSimilarityEvaluator.from_file(same)
    zeros = tmp_path / "zeros.csv"
    zeros.write_text("sentence1,sentence2,label\na,b,0\nc,d,0\n")
    with pytest.raises(DataError, match="zeros.csv: field 'label': every label is 0"):
        pairs.BinaryClassificationEvaluator.from_file(zeros)


def test_beir_folder_problems_name_the_missing_file_and_bad_row(tmp_path):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "y"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t+-1\n")
    with pytest.raises(FileNotFoundError, match=r"no qrels/dev.tsv \(qrels splits there: "
                       r"\['test'\]\)"):
        retrieval.read_beir(beir, split="dev")
    with pytest.raises(DataError, match=r"test.tsv:2: field 'score': not an integer"):
        retrieval.read_beir(beir)
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t"
                                             "99999999999999999999999\n")
    with pytest.raises(DataError, match=r"test.tsv:2: field 'score': 99999999999999999999999 "
                       r"is out of range \(a grade is a small integer"):
        retrieval.read_beir(beir)  # was an OverflowError traceback when scored
    # "1.0" is a grade, as pair files take it; "1.5" and "inf" are not.
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2.0\n")
    assert retrieval.read_beir(beir)[2] == {"q1": {"d1": 2}}
    for bad in ("1.5", "inf", "nan"):
        (beir / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\td1\t{bad}\n")
        with pytest.raises(DataError, match=f"test.tsv:2: field 'score': not an integer: '{bad}'"):
            retrieval.read_beir(beir)


def test_labels_never_collide():
    assert run._labels([("sts", "a/x.csv"), ("sts", "b/x.csv"), ("ir", "d")]) == \
        ["sts:x", "sts:x#2", "ir"]
    assert run._labels([("sts", "x.csv"), ("sts", "x.jsonl"), ("sts", "x.csv")]) == \
        ["sts:x", "sts:x#2", "sts:x#3"]
    assert run.finite_or_none({"a": float("nan"), "b": {"c": 1.0}}) == {"a": None,
                                                                      "b": {"c": 1.0}}


def test_cli_refuses_an_output_folder_before_loading_the_model(tmp_path, capsys):
    sts = tmp_path / "sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": f"a {i}", "sentence2": "b",
                                       "score": i}) + "\n" for i in range(3)))
    # A model that does not exist: the output check must come first.
    assert cli.main(["--model=/nonexistent", f"--sts={sts}", f"--output={tmp_path}"]) == 1
    assert "is a folder; name a file" in capsys.readouterr().err


def test_cli_prints_and_writes_the_dropped_queries(tmp_path, capsys, tiny_bert_dir):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "a cat"}\n'
                                       '{"_id": "d2", "text": "a dog"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "cat"}\n'
                                        '{"_id": "q2", "text": "dog"}\n'
                                        '{"_id": "q3", "text": "cow"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\n"
                                             "q2\td2\t1\nq3\td1\t0\n")
    out = tmp_path / "results.json"
    assert cli.main([f"--model={tiny_bert_dir}", f"--ir={beir}", f"--output={out}"]) == 0
    printed = capsys.readouterr().out
    assert f"ir (retrieval) on {beir} (1 queries without a relevant document dropped):" \
        in printed
    result = json.loads(out.read_text())["results"]["ir"]
    assert result["dropped_queries"] == 1
    assert set(result["metrics"]) >= {"cosine_ndcg@10", "dot_map@100"}


def test_config_eval_files_name_the_field_and_take_an_escaped_comma(tmp_path, capsys):
    from embedding_core.training.run import _eval_files
    from tests.embedding_core.test_run import _config

    sts = tmp_path / "dev,v2.csv"
    sts.write_text("sentence1,sentence2,score\na,b,1\nc,d,2\ne,f,3\n")
    built = _eval_files(_config(eval_every=6, eval_files=rf"sts:{tmp_path}/dev\,v2.csv"))
    assert [(spec.kind, spec.file) for spec, _ in built] == [("sts", str(sts))]
    assert len(built[0][1].sentences1) == 3
    # Unescaped, the comma splits the path into two specs: the second has no KIND.
    with pytest.raises(ValueError, match=r"^config.eval_files: evaluation 'v2.csv': write "
                       r"KIND:PATH .*; a comma inside a path is written \\,$"):
        _eval_files(_config(eval_every=6, eval_files=f"sts:{tmp_path}/dev,v2.csv"))
    with pytest.raises(FileNotFoundError) as err:
        _eval_files(_config(eval_every=6, eval_files=f"sts:{tmp_path}/nope.csv"))
    assert str(err.value) == f"config.eval_files: {tmp_path}/nope.csv does not exist"
    assert cli.main(["--model=org/model", f"--sts={tmp_path}/nope.csv"]) == 1
    assert capsys.readouterr().err == (f"embedding-jax evaluate: error: --sts {tmp_path}/"
                                       "nope.csv does not exist\n")


def test_a_folder_for_a_one_file_kind_and_a_space_after_the_kind(tmp_path, capsys):
    """'sts:FOLDER' said 'FOLDER: no such file'; 'sts: a.csv' looked for ' a.csv'."""
    from embedding_core.training.run import _eval_files
    from tests.embedding_core.test_run import _config

    sts = tmp_path / "dev.csv"
    sts.write_text("sentence1,sentence2,score\na,b,1\nc,d,2\ne,f,3\n")
    built = _eval_files(_config(eval_every=6, eval_files=f"sts: {sts}"))
    assert [(spec.kind, spec.file) for spec, _ in built] == [("sts", str(sts))]
    assert [(s.kind, s.file) for s in run.parse(f" pairs : {sts} ")] == [("pairs", str(sts))]
    for kind in ("sts", "pairs", "triplets"):
        with pytest.raises(ValueError) as err:
            _eval_files(_config(eval_every=6, eval_files=f"{kind}:{tmp_path}"))
        assert str(err.value) == (f"config.eval_files: {tmp_path} is a folder; {kind} reads "
                                  "one CSV or JSON Lines file")
    assert cli.main(["--model=org/model", f"--sts={tmp_path}"]) == 1
    assert capsys.readouterr().err == (f"embedding-jax evaluate: error: --sts {tmp_path} is a "
                                       "folder; sts reads one CSV or JSON Lines file\n")
