"""DualCSE's field layout and token tables (DualCSE, supervised SimCSE): each text tokenised
once; text ids span the table, so a sentence in two roles has one id (``docs/dualcse.md``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from data_pipelines.inli import INLIExample
from data_pipelines.snli import Triplet
from data_pipelines.table import TokenTable, stack_fields, text_identity_ids
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached
from dualcse_jax.configs import ARCHITECTURES

TokenizerLike = Tokenizer | str | os.PathLike  # a folder / tokenizer.json path is cached
INDICATORS = ("explicit", "implicit")  # cross-encoder: s [SEP] explicit -> r, implicit -> u
INLI_SENTENCES = ("premise", "explicit_hyp", "implied_hyp", "contradiction")  # no neutral
SIMCSE_SENTENCES = ("anchor", "positive", "hard_negative")


def cross_field(sentence: str, indicator: str) -> str:
    """The cross field of ``sentence`` read with ``indicator`` (``premise_explicit``)."""
    return f"{sentence}_{indicator}"


SENTENCES = {"cross": INLI_SENTENCES, "bi": INLI_SENTENCES, "simcse": SIMCSE_SENTENCES}
"""Each architecture's sentences, in the model's sentence-axis order."""
FIELDS = {
    "cross": tuple(cross_field(s, i) for s in INLI_SENTENCES for i in INDICATORS),
    "bi": INLI_SENTENCES,
    "simcse": SIMCSE_SENTENCES,
}
"""Each architecture's table fields (the F axis); cross: one per (sentence, indicator)."""


def _check_architecture(architecture: str) -> None:
    if architecture not in FIELDS:
        raise ValueError(f"architecture {architecture!r}: use one of {ARCHITECTURES}")


def field_index(architecture: str, name: str) -> int:
    """Position of field ``name`` on the F axis; ValueError for an unknown one."""
    _check_architecture(architecture)
    if name not in FIELDS[architecture]:
        raise ValueError(f"{architecture} tables have no field {name!r}; they have "
                         f"{FIELDS[architecture]}")
    return FIELDS[architecture].index(name)


def sentence_fields(architecture: str, indicator: str = "explicit") -> tuple[int, ...]:
    """Field positions of each sentence read for ``indicator``; ValueError if unknown."""
    if indicator not in INDICATORS:
        raise ValueError(f"indicator {indicator!r}: use one of {INDICATORS}")
    _check_architecture(architecture)
    return tuple(field_index(architecture, s if architecture != "cross" else
                             cross_field(s, indicator)) for s in SENTENCES[architecture])


def sentence_slot(architecture: str, sentence: str) -> int:
    """Position of ``sentence`` on the model's sentence axis (``premise`` -> 0)."""
    _check_architecture(architecture)
    return SENTENCES[architecture].index(sentence)


def length_groups(architecture: str) -> tuple[tuple[int, ...], ...]:
    """(first sentence's fields, the rest): long premise padded apart from short hypotheses."""
    head = sorted({sentence_fields(architecture, indicator)[0] for indicator in INDICATORS})
    rest = [i for i in range(len(FIELDS[architecture])) if i not in head]
    return tuple(head), tuple(rest)


def _tokenize(tokenizer: TokenizerLike, texts: Sequence[str], max_length: int,
              pair: str | None = None) -> TokenizedTexts:
    if isinstance(tokenizer, Tokenizer):
        return tokenize(tokenizer, texts, max_length, pair)
    return tokenize_cached(tokenizer, texts, max_length, pair)


def _split_ids(ids: np.ndarray, parts: int) -> list[np.ndarray]:
    return list(ids.reshape(parts, -1))


def inli_table(examples: Sequence[INLIExample], tokenizer: TokenizerLike, max_length: int,
               *, encoder: str = "cross") -> TokenTable:
    """One row per INLI premise, fields :data:`FIELDS` of ``encoder`` (F = 8 cross, 4 bi) of
    ``max_length`` tokens, ``text_ids [n, F]`` int32; ValueError for an unknown encoder or a
    ``max_length`` too small for the indicator."""
    if encoder not in ("cross", "bi"):
        raise ValueError(f"encoder must be 'cross' or 'bi', got {encoder!r}")
    columns = {
        "premise": [e.premise for e in examples],
        "explicit_hyp": [e.explicit_entailment for e in examples],
        "implied_hyp": [e.implied_entailment for e in examples],
        "contradiction": [e.contradiction for e in examples],
    }
    all_ids = text_identity_ids([t for name in INLI_SENTENCES for t in columns[name]])
    ids = dict(zip(INLI_SENTENCES, _split_ids(all_ids, len(INLI_SENTENCES)), strict=True))
    fields: dict[str, TokenizedTexts] = {}
    text_ids: dict[str, np.ndarray] = {}
    for sentence in INLI_SENTENCES:
        for indicator in INDICATORS if encoder == "cross" else (None,):
            key = sentence if indicator is None else cross_field(sentence, indicator)
            fields[key] = _tokenize(tokenizer, columns[sentence], max_length, pair=indicator)
            text_ids[key] = ids[sentence]
    return stack_fields({name: fields[name] for name in FIELDS[encoder]}, text_ids)


def simcse_table(anchors: Sequence[str], positives: Sequence[str], negatives: Sequence[str],
                 tokenizer: TokenizerLike, max_length: int) -> TokenTable:
    """Rows (anchor, positive, hard negative), F = 3; ValueError: lists of unequal length."""
    if not len(anchors) == len(positives) == len(negatives):
        raise ValueError(f"anchors, positives and negatives differ in length: "
                         f"{len(anchors)}, {len(positives)}, {len(negatives)}")
    texts = (list(anchors), list(positives), list(negatives))
    all_ids = text_identity_ids([t for column in texts for t in column])
    fields = {name: _tokenize(tokenizer, column, max_length)
              for name, column in zip(SIMCSE_SENTENCES, texts, strict=True)}
    return stack_fields(fields, dict(zip(SIMCSE_SENTENCES, _split_ids(all_ids, 3), strict=True)))


def simcse_table_from_snli(triplets: Sequence[Triplet], tokenizer: TokenizerLike,
                           max_length: int) -> TokenTable:
    """SimCSE(SNLI): (sent0, sent1, hard_neg) as (anchor, positive, hard_negative)."""
    return simcse_table([t.sent0 for t in triplets], [t.sent1 for t in triplets],
                        [t.hard_neg for t in triplets], tokenizer, max_length)


def simcse_table_from_inli(examples: Sequence[INLIExample], tokenizer: TokenizerLike,
                           max_length: int) -> TokenTable:
    """SimCSE(INLI): rows 2i, 2i+1 = (premise, explicit / implied, contradiction), sharing the
    anchor's text id (``loss.simcse_loss`` masks the sibling)."""
    anchors, positives, negatives = [], [], []
    for e in examples:
        for positive in (e.explicit_entailment, e.implied_entailment):
            anchors.append(e.premise)
            positives.append(positive)
            negatives.append(e.contradiction)
    return simcse_table(anchors, positives, negatives, tokenizer, max_length)
