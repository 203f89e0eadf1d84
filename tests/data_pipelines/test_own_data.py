"""The user's own data files (docs/data.md, "Your own data"): the example files read to the
values written in them, CSV and JSON Lines agree, every bad input is one line naming file,
line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipelines import entity_documents, records, sentence_files
from data_pipelines.errors import DataError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
INLI_HEADER = "premise,explicit_entailment,implied_entailment,neutral,contradiction"


def test_example_pairs_csv():
    rows = sentence_files.read_inli_file(EXAMPLES / "my_pairs.csv", require_neutral=True)
    assert len(rows) == 16
    first = rows[0]
    # Doubled quotes inside a quoted field are one quote.
    assert first.premise == ('"Are you coming to the party tonight?" '
                             '"I have to finish my thesis."')
    assert first.implied_entailment == "The speaker is not coming to the party."
    assert first.neutral == "The party is at a friend's house."
    assert (first.line, first.dataset) == (2, "")
    # Row 8 holds a quoted line break: it starts on line 9 and the next row on line 11.
    assert rows[7].explicit_entailment == "The speaker's sister is getting married\non Saturday."
    assert (rows[7].line, rows[8].line, rows[-1].line) == (9, 11, 18)


def test_example_simcse_jsonl_hard_negative_absent_or_null():
    pairs = sentence_files.read_anchor_pairs(EXAMPLES / "my_simcse.jsonl")
    assert len(pairs) == 8
    assert pairs[0] == sentence_files.AnchorPair(
        "A man is playing a guitar on stage.", "Someone performs music.",
        "The stage is empty.", 1)
    assert [p.line for p in pairs if p.hard_negative is None] == [4, 6]  # absent, null


def test_example_documents_and_queries():
    docs = entity_documents.read_entity_documents(EXAMPLES / "my_docs.jsonl")
    assert [d.line for d in docs] == list(range(1, 9))
    ids, sentences = entity_documents.entity_sentences(docs)
    assert ids == ["bakery", "library", "lighthouse", "observatory"]  # sorted, not file order
    # Two-sentence documents are split, one-sentence ones kept: 4 x 2 + 4 x 1.
    assert len(sentences) == 12
    assert sentences[:3] == [
        (2, "It stands on a rocky point at the mouth of the harbour."),
        (2, "Its lamp turns every ten seconds and can be seen twenty miles out to sea."),
        (2, "The keeper climbed its spiral stairs every evening to light the lamp.")]
    index = {e: i for i, e in enumerate(ids)}
    queries = entity_documents.read_entity_queries(EXAMPLES / "my_queries.jsonl", index)
    assert [rel for _, rel in queries] == [(0,), (2,), (3,), (1,)]
    assert queries[1][0] == "a tower that guides ships at night"


ROWS = [
    {"premise": "p one", "explicit_entailment": "e one", "implied_entailment": "i, one",
     "neutral": "n one", "contradiction": 'c "one"'},
    {"premise": "p two\nsecond line", "explicit_entailment": "e two",
     "implied_entailment": "i two", "neutral": "n two", "contradiction": "c two"},
]


def _csv_text(rows) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=INLI_HEADER.split(","), lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@pytest.mark.parametrize("name", ["pairs.csv", "pairs.jsonl", "pairs.txt", "pairs_jsonl.txt"])
def test_csv_and_jsonl_with_bom_and_crlf_give_the_same_rows(tmp_path, name):
    if "jsonl" in name:
        text = "\r\n".join(json.dumps(r) for r in ROWS) + "\r\n"
    else:
        text = _csv_text(ROWS)
    path = tmp_path / name  # .txt: the format is sniffed from the first character
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    rows = sentence_files.read_inli_file(path, require_neutral=True)
    got = [{k: getattr(r, k) for k in ROWS[0]} for r in rows]
    assert got == ROWS
    assert [r.line for r in rows] == ([1, 2] if "jsonl" in name else [2, 3])


def test_optional_field_empty_in_csv_is_absent(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("anchor,positive,hard_negative\na,b,\nc,d,e\n")
    assert [p.hard_negative for p in sentence_files.read_anchor_pairs(path)] == [None, "e"]


def _jsonl(*lines) -> bytes:
    return b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines)


GOOD = {"premise": "p", "explicit_entailment": "e", "implied_entailment": "i",
        "contradiction": "c"}
DOC = {"entity": "E1", "text": "Some text."}

# (file name, bytes, reader, expected line, expected field, words in the reason)
BAD = [
    # CSV, through the shipped sets' reader
    ("a.csv", b"premise,explicit_entailment,implied_entailment\np,e,i\n", "inli", 1,
     "contradiction", "required column missing"),
    ("a.csv", (INLI_HEADER + "\np,e,i,n,c\np,e, ,n,c\n").encode(), "inli", 3,
     "implied_entailment", "empty"),
    ("a.csv", (INLI_HEADER + "\np,e,i,n,c\np,e\x00x,i,n,c\n").encode(), "inli", 3,
     "explicit_entailment", "NUL"),
    ("a.csv", (INLI_HEADER + "\np,e,i,n,c\np,\xff,i,n,c\n").encode("latin-1"), "inli", 3,
     None, "invalid UTF-8"),
    ("a.csv", (INLI_HEADER + '\np,e,i,n,c\np,"e"x,i,n,c\n').encode(), "inli", 3,
     "explicit_entailment", "malformed"),
    ("a.csv", (INLI_HEADER + "\np,e,i,n,c,extra\n").encode(), "inli", 2, None, "6 fields"),
    ("a.csv", b"anchor,positive\na,b\n", "inli", 1, "premise", "architecture=simcse"),
    # JSON Lines
    ("a.jsonl", _jsonl(GOOD, b'{"premise": "p",'), "inli", 2, None, "invalid JSON"),
    ("a.jsonl", _jsonl(GOOD, [GOOD]), "inli", 2, None, "got an array"),
    ("a.jsonl", _jsonl(GOOD, {**GOOD, "contradiction": None}), "inli", 2, "contradiction",
     "null"),
    ("a.jsonl", _jsonl(GOOD, {k: v for k, v in GOOD.items() if k != "premise"}), "inli", 2,
     "premise", "missing (the record has ['contradiction', 'explicit_entailment', "
     "'implied_entailment'])"),
    ("a.jsonl", _jsonl(GOOD, {**GOOD, "premise": 7}), "inli", 2, "premise",
     'expected a string, got a number (write it as a string: "7")'),
    ("a.jsonl", _jsonl(GOOD, b"", {**GOOD, "premise": "  "}), "inli", 3, "premise", "empty"),
    ("a.jsonl", _jsonl(GOOD, b'{"premise": "p", "premise": "q"}'), "inli", 2, "premise",
     "twice"),
    ("a.jsonl", _jsonl(GOOD, {**GOOD, "implied_entailment": "i\u0000"}), "inli", 2,
     "implied_entailment", "NUL"),
    ("a.jsonl", _jsonl(GOOD, b'{"premise": "p\x00"}'), "inli", 2, "premise", "NUL"),
    ("a.jsonl", _jsonl(GOOD, b'{"premise": "p"}\x00'), "inli", 2, None, "NUL byte"),
    ("a.jsonl", _jsonl(GOOD, b'{"premise": "\xff"}'), "inli", 2, None, "invalid UTF-8"),
    ("a.jsonl", _jsonl(GOOD, {**GOOD, "contradiction": "ab\ud800"}), "inli", 2,
     "contradiction", "lone surrogate \\ud800 at character 3"),
    ("a.jsonl", _jsonl({"anchor": "a", "positive": "b"}), "inli", 1, "premise",
     "architecture=simcse"),
    ("a.jsonl", _jsonl({"anchor": "a", "positive": ["b"]}), "simcse", 1, "positive",
     "got an array"),
    # DocEnt documents and queries
    ("d.jsonl", _jsonl(DOC, {"entity": 42, "text": "t"}), "docs", 2, "entity",
     'write it as a string: "42"'),
    ("d.jsonl", _jsonl(DOC, {"entity": "a\nb", "text": "t"}), "docs", 2, "entity",
     "line break"),
    ("d.jsonl", _jsonl(DOC, {"entity": "E1"}), "docs", 2, "text", "missing"),
    ("d.jsonl", _jsonl(DOC, b'{"entity": "E1", "text": "\\udc00x"}'), "docs", 2, "text",
     "lone surrogate \\udc00 at character 1"),
    ("q.jsonl", _jsonl({"query": "q", "entities": ["E1"]},
                       {"query": "q", "entities": ["E1", "E9"]}), "queries", 2, "entities[1]",
     "'E9' is not among the 1 entities"),
    ("q.jsonl", _jsonl({"query": "q", "entities": "E1"}), "queries", 1, "entities",
     "array of strings"),
    ("q.jsonl", _jsonl({"query": "q", "entities": []}), "queries", 1, "entities", "empty list"),
    ("q.jsonl", _jsonl({"query": "q", "entities": [1]}), "queries", 1, "entities[0]",
     "expected a string"),
    ("q.jsonl", _jsonl({"query": "q", "entities": ["E1\udfff"]}), "queries", 1,
     "entities[0]", "lone surrogate"),
    ("q.csv", b"query,entities\nq,E1\n", "queries", None, None, "must be JSON Lines"),
    ("e.jsonl", b"\n\r\n", "docs", None, None, "0 records"),
]


def _read(kind: str, path: Path):
    if kind == "inli":
        return sentence_files.read_inli_file(path)
    if kind == "simcse":
        return sentence_files.read_anchor_pairs(path)
    if kind == "docs":
        return entity_documents.read_entity_documents(path)
    return entity_documents.read_entity_queries(path, {"E1": 0})


@pytest.mark.parametrize("name,content,kind,line,field,reason", BAD,
                         ids=[f"{i}-{case[0]}-{case[5]}" for i, case in enumerate(BAD)])
def test_bad_input_is_one_line_naming_file_line_and_field(tmp_path, name, content, kind, line,
                                                          field, reason):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        _read(kind, path)
    err = info.value
    message = str(err)
    assert "\n" not in message, message
    assert (err.path, err.line, err.field) == (str(path), line, field), message
    where = str(path) if line is None else f"{path}:{line}"
    assert message.startswith(f"{where}: " + (f"field '{field}': " if field else "")), message
    assert reason in message, message


def test_csv_field_over_the_csv_module_default_limit(tmp_path):
    long_text = "word " * 40_000  # 200,000 characters, over csv's default 131,072
    path = tmp_path / "long.csv"
    path.write_text(f'premise,anchor\np,"{long_text}"\n', encoding="utf-8")
    assert records.read_records(path, ("premise", "anchor")) == [
        {"premise": "p", "anchor": long_text, "_line": 2}]


def test_missing_file_and_unknown_list_field(tmp_path):
    with pytest.raises(FileNotFoundError):
        sentence_files.read_inli_file(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="list_fields"):
        records.read_records(tmp_path / "x.jsonl", ["a"], list_fields=["b"])


def test_a_folder_given_as_a_data_file_is_one_line_naming_it(tmp_path):
    """Was "[Errno 21] Is a directory: PATH" from open() (dualcse-jax train
    --config.train_file=FOLDER)."""
    with pytest.raises(DataError) as err:
        sentence_files.read_inli_file(tmp_path)
    assert str(err.value) == f"{tmp_path}: a folder, not a file; give one CSV or JSON Lines file"


def test_gs_uris_read_like_local_files(gcs_emulator):
    from data_pipelines import squad
    from embedding_core.storage import storage
    from embedding_core.storage.storage import absolute_data_paths

    bucket = "gs://test-bucket/own_data"
    for name in ("my_pairs.csv", "my_simcse.jsonl", "my_docs.jsonl", "my_queries.jsonl",
                 "my_squad.json"):
        storage.write_bytes(f"{bucket}/{name}", (EXAMPLES / name).read_bytes())
    assert (sentence_files.read_inli_file(f"{bucket}/my_pairs.csv")
            == sentence_files.read_inli_file(EXAMPLES / "my_pairs.csv"))
    assert (sentence_files.read_anchor_pairs(f"{bucket}/my_simcse.jsonl")
            == sentence_files.read_anchor_pairs(EXAMPLES / "my_simcse.jsonl"))
    docs = entity_documents.read_entity_documents(f"{bucket}/my_docs.jsonl")
    assert docs == entity_documents.read_entity_documents(EXAMPLES / "my_docs.jsonl")
    assert entity_documents.read_entity_queries(f"{bucket}/my_queries.jsonl", {
        "bakery": 0, "library": 1, "lighthouse": 2, "observatory": 3})[0][1] == (0,)
    assert (squad.read_squad(f"{bucket}/my_squad.json")
            == squad.read_squad(EXAMPLES / "my_squad.json"))
    storage.write_bytes(f"{bucket}/bad.jsonl", b'{"entity": "a", "text": "t"}\n{"entity": 1}\n')
    with pytest.raises(DataError, match=f"^{bucket}/bad.jsonl:2: field 'entity': expected a "
                                        "string"):
        entity_documents.read_entity_documents(f"{bucket}/bad.jsonl")
    config = {"train_file": f"{bucket}/my_docs.jsonl", "other": "x"}
    assert absolute_data_paths(config, ["train_file", "missing"])["train_file"] == (
        f"{bucket}/my_docs.jsonl")  # a URI is kept as it is
