"""Token tables for DualCSE (Oda et al. 2025) and its supervised-SimCSE baselines.

Each builder tokenises every text once (through the on-disk cache when given a tokenizer
path) and returns a :class:`~data_pipelines.table.TokenTable` for
:func:`data_pipelines.pipeline.make_batches`. Text identities are computed over all the
sentences of the table together, so a sentence that appears under two roles (INLI test rows
93 and 477 repeat the explicit entailment as the implied one) has one id everywhere.

The field layout of each architecture is declared here once (:data:`FIELDS`,
:data:`SENTENCES`); the model, the loss and the length groups look fields up by name
(:func:`sentence_fields`, :func:`sentence_slot`, :func:`length_groups`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from data_pipelines.inli import INLIExample
from data_pipelines.snli import Triplet
from data_pipelines.table import TokenTable, stack_fields, text_identity_ids
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached

TokenizerLike = Tokenizer | str | os.PathLike
"""A loaded ``tokenizers.Tokenizer`` (no cache) or a folder / tokenizer.json path (cached)."""

INDICATORS = ("explicit", "implicit")
"""DualCSE's indicator words: the cross-encoder reads ``s [SEP] explicit`` for r and
``s [SEP] implicit`` for u."""

INLI_SENTENCES = ("premise", "explicit_hyp", "implied_hyp", "contradiction")
"""The INLI sentences DualCSE trains on, in field order (neutral hypotheses are unused)."""

SIMCSE_SENTENCES = ("anchor", "positive", "hard_negative")
"""The supervised-SimCSE sentences, in field order."""

# ----------------------------------------------------------------------------- layout
# The one declaration of each architecture's fields. Models, losses and the input pipeline
# read fields by name through the helpers below, never by position.

ARCHITECTURES = ("cross", "bi", "simcse")


def cross_field(sentence: str, indicator: str) -> str:
    """The cross-encoder field of ``sentence`` read with ``indicator`` (``premise_explicit``)."""
    return f"{sentence}_{indicator}"


SENTENCES = {"cross": INLI_SENTENCES, "bi": INLI_SENTENCES, "simcse": SIMCSE_SENTENCES}
"""Each architecture's sentences, in the order of the model's ``[batch, sentence]`` axis."""

FIELDS = {
    "cross": tuple(cross_field(s, i) for s in INLI_SENTENCES for i in INDICATORS),
    "bi": INLI_SENTENCES,
    "simcse": SIMCSE_SENTENCES,
}
"""Each architecture's table fields, in the order of the table's F axis: the cross-encoder
has one field per (sentence, indicator), bi-encoder and SimCSE one per sentence."""


def _check_architecture(architecture: str) -> None:
    if architecture not in FIELDS:
        raise ValueError(f"architecture {architecture!r}: use one of {ARCHITECTURES}")


def field_index(architecture: str, name: str) -> int:
    """Position of the field ``name`` on the table's F axis.

    Raises:
      ValueError: unknown architecture or field.
    """
    _check_architecture(architecture)
    if name not in FIELDS[architecture]:
        raise ValueError(f"{architecture} tables have no field {name!r}; they have "
                         f"{FIELDS[architecture]}")
    return FIELDS[architecture].index(name)


def sentence_fields(architecture: str, indicator: str = "explicit") -> tuple[int, ...]:
    """Field positions of each sentence, in sentence order, as read for ``indicator``.

    The cross-encoder reads sentence s as the field ``s_explicit`` for r and ``s_implicit``
    for u; bi-encoder and SimCSE have one field per sentence whatever the indicator.

    Raises:
      ValueError: unknown architecture or indicator.
    """
    if indicator not in INDICATORS:
        raise ValueError(f"indicator {indicator!r}: use one of {INDICATORS}")
    _check_architecture(architecture)
    if architecture != "cross":
        return tuple(field_index(architecture, s) for s in SENTENCES[architecture])
    return tuple(field_index(architecture, cross_field(s, indicator))
                 for s in SENTENCES[architecture])


def sentence_slot(architecture: str, sentence: str) -> int:
    """Position of ``sentence`` on the model's sentence axis (e.g. ``premise`` -> 0)."""
    _check_architecture(architecture)
    return SENTENCES[architecture].index(sentence)


def length_groups(architecture: str) -> tuple[tuple[int, ...], ...]:
    """Field groups padded separately: the (long) first sentence, premise or anchor, apart
    from the (short) hypotheses; each group lists field positions in table order."""
    head = sorted({sentence_fields(architecture, indicator)[0] for indicator in INDICATORS})
    rest = [i for i in range(len(FIELDS[architecture])) if i not in head]
    return tuple(head), tuple(rest)


def _tokenize(
    tokenizer: TokenizerLike, texts: Sequence[str], max_length: int, pair: str | None = None
) -> TokenizedTexts:
    if isinstance(tokenizer, Tokenizer):
        return tokenize(tokenizer, texts, max_length, pair)
    return tokenize_cached(tokenizer, texts, max_length, pair)


def _split_ids(ids: np.ndarray, parts: int) -> list[np.ndarray]:
    return list(ids.reshape(parts, -1))


def inli_table(
    examples: Sequence[INLIExample],
    tokenizer: TokenizerLike,
    max_length: int,
    *,
    encoder: str = "cross",
) -> TokenTable:
    """DualCSE training table: one row per INLI premise.

    Fields (declared in :data:`FIELDS`), for ``encoder="cross"`` (one encoder reading
    ``[CLS] s [SEP] indicator [SEP]``; only s is truncated): premise_explicit,
    premise_implicit, explicit_hyp_explicit, explicit_hyp_implicit, implied_hyp_explicit,
    implied_hyp_implicit, contradiction_explicit, contradiction_implicit. For
    ``encoder="bi"`` (two encoders, one for r and one for u, on the plain sentence):
    premise, explicit_hyp, implied_hyp, contradiction. In the loss's notation
    (``docs/dualcse.md``), r_i/u_i come from the premise, r+_i1/u+_i1 from explicit_hyp,
    r+_i2/u+_i2 from implied_hyp, r-_i/u-_i from contradiction.

    Args:
      examples: n INLI rows (see :func:`data_pipelines.inli.read_inli`).
      tokenizer: a loaded tokenizer, or a folder / tokenizer.json path to use the token cache.
      max_length: the most tokens per sequence, special tokens and indicator included.
      encoder: "cross" or "bi".

    Returns:
      A TokenTable with F = 8 (cross) or 4 (bi) fields; ``text_ids`` [n, F] int32 is the
      sentence's identity (both indicator views of a sentence share it), computed over all
      the premises and hypotheses of ``examples`` together.

    Raises:
      ValueError: unknown encoder, or max_length too small for the indicator.
    """
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


def simcse_table(
    anchors: Sequence[str],
    positives: Sequence[str],
    negatives: Sequence[str],
    tokenizer: TokenizerLike,
    max_length: int,
) -> TokenTable:
    """Supervised-SimCSE table (Gao et al. 2021): fields anchor, positive, hard_negative.

    Args:
      anchors, positives, negatives: n texts each; row i is (anchor_i, positive_i,
        hard negative_i).
      tokenizer: a loaded tokenizer, or a folder / tokenizer.json path to use the token cache.
      max_length: the most tokens per sequence, special tokens included.

    Returns:
      A TokenTable with F = 3; ``text_ids`` computed over all 3n texts together.

    Raises:
      ValueError: the three lists differ in length.
    """
    if not len(anchors) == len(positives) == len(negatives):
        raise ValueError(
            f"anchors, positives and negatives differ in length: "
            f"{len(anchors)}, {len(positives)}, {len(negatives)}"
        )
    names = SIMCSE_SENTENCES
    texts = (list(anchors), list(positives), list(negatives))
    all_ids = text_identity_ids([t for column in texts for t in column])
    fields = {
        name: _tokenize(tokenizer, column, max_length)
        for name, column in zip(names, texts, strict=True)
    }
    return stack_fields(fields, dict(zip(names, _split_ids(all_ids, 3), strict=True)))


def simcse_table_from_snli(
    triplets: Sequence[Triplet], tokenizer: TokenizerLike, max_length: int
) -> TokenTable:
    """SimCSE(SNLI) table: (sent0, sent1, hard_neg) as (anchor, positive, hard_negative)."""
    return simcse_table(
        [t.sent0 for t in triplets],
        [t.sent1 for t in triplets],
        [t.hard_neg for t in triplets],
        tokenizer,
        max_length,
    )


def simcse_table_from_inli(
    examples: Sequence[INLIExample], tokenizer: TokenizerLike, max_length: int
) -> TokenTable:
    """SimCSE(INLI) table: two rows per premise, rows 2i and 2i+1 of example i.

    Row 2i is (premise, explicit entailment, contradiction) and row 2i+1 is (premise,
    implied entailment, contradiction): both entailments are positives of the premise, the
    contradiction is the hard negative. The two rows share the premise, so in one batch the
    other row's positive is a false negative; a loss can mask it by comparing the anchors'
    ``text_ids``.
    """
    anchors, positives, negatives = [], [], []
    for e in examples:
        for positive in (e.explicit_entailment, e.implied_entailment):
            anchors.append(e.premise)
            positives.append(positive)
            negatives.append(e.contradiction)
    return simcse_table(anchors, positives, negatives, tokenizer, max_length)
