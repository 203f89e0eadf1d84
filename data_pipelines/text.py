"""Sentence splitting, entity-name removal and word counts for entity corpora
(``docs/docent.md``)."""

from __future__ import annotations

import functools
import re

import pysbd

# A trailing parenthesised part of a name: the year of a MovieLens title ("Toy Story (1995)"),
# an alternative title ("City of Lost Children, The (Cité des enfants perdus, La)") or a
# Wikipedia disambiguator ("Sky (United Kingdom)").
_TRAILING_PARENS = re.compile(r"^(?P<base>.*\S)\s*\([^()]*\)\s*$")
# MovieLens moves a leading article to the end: "American President, The (1995)".
_MOVED_ARTICLE = re.compile(
    r"^(?P<base>.*\S),\s*(?P<article>The|A|An|Les|La|Le|L'|Il|El|Los|Las|Das|Der|Die)$",
    re.IGNORECASE,
)


# pySBD's time grows faster than linearly with the text (a one-line 1.5 MB document would
# never finish): longer texts are split a window of this many characters at a time.
_WINDOW_CHARS = 2000


def _last_start(window: str, sentences: list[str]) -> int:
    """Offset in ``window`` of pySBD's last sentence, or 0 when it cannot be placed."""
    position = 0
    for sentence in sentences:
        found = window.find(sentence, position)
        if found < 0:
            return 0
        start, position = found, found + len(sentence)
    return start if sentences else 0


def _fallback_cut(window: str) -> int:
    # One sentence fills the whole window: cut after its last line break, else at its last
    # whitespace, else hard (a run of 2,000 characters without a space is not prose).
    for separator in ("\n", " ", "\t"):
        at = window.rfind(separator)
        if at > 0:
            return at + 1
    return len(window)


@functools.lru_cache(maxsize=1)
def _segmenter() -> pysbd.Segmenter:
    # Building the segmenter compiles many regexes; one per process is enough.
    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str) -> list[str]:
    """Stripped, non-empty pySBD sentences (``clean=False``); texts over 2,000 characters go a
    window at a time (``docs/data.md``)."""
    if not text.strip():
        return []
    segmenter = _segmenter()
    sentences: list[str] = []
    start = 0
    while len(text) - start > _WINDOW_CHARS:
        window = text[start : start + _WINDOW_CHARS]
        found = segmenter.segment(window)
        # The window's last sentence may run past its end: keep the ones before it and
        # start the next window where it starts.
        cut = _last_start(window, found)
        if cut > 0:
            sentences.extend(found[:-1])
        else:
            cut = _fallback_cut(window)
            sentences.extend(segmenter.segment(window[:cut]))
        start += cut
    sentences.extend(segmenter.segment(text[start:]))
    return [s.strip() for s in sentences if s.strip()]


def entity_name_variants(name: str) -> list[str]:
    """The forms :func:`remove_entity_name` removes, distinct, longest first: the name, the name
    without each trailing parenthesised part ("Toy Story (1995)" -> "Toy Story"), and MovieLens
    moved articles put back ("Matrix, The" -> "The Matrix", "Matrix"); underscores count as spaces.
    """
    variants: list[str] = []
    current = " ".join(name.replace("_", " ").split())
    while current:
        variants.append(current)
        moved = _MOVED_ARTICLE.match(current)
        if moved:
            variants.append(f"{moved['article']} {moved['base']}")
            variants.append(moved["base"])
        parens = _TRAILING_PARENS.match(current)
        current = parens["base"] if parens else ""
    unique = list(dict.fromkeys(v for v in variants if v))
    return sorted(unique, key=len, reverse=True)


@functools.lru_cache(maxsize=65536)
def _name_pattern(name: str) -> re.Pattern[str] | None:
    variants = entity_name_variants(name)
    if not variants:
        return None
    # Whole-phrase match: no word character may touch the phrase on either side (works for
    # names ending in punctuation, "M*A*S*H"); inner whitespace matches any run of it.
    alternatives = "|".join(r"\s+".join(re.escape(w) for w in v.split()) for v in variants)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def remove_entity_name(sentence: str, name: str) -> str:
    """Removes whole-phrase, case-insensitive :func:`entity_name_variants`, collapses spaces."""
    pattern = _name_pattern(name)
    if pattern is not None:
        sentence = pattern.sub(" ", sentence)
    return " ".join(sentence.split())


def count_words(text: str) -> int:
    """Whitespace-separated tokens (the unit of DocEnt's 5-word review filter; our reading)."""
    return len(text.split())
