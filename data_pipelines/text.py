"""Sentence splitting, entity-name removal and word counts for the entity corpora.

DocEnt (Zemlyanskiy et al., EACL 2021, section 4.4) splits every review into sentences "so as
to circumvent the BERT sequence length limit" and removes "movie names from their reviews";
reviews under 5 words are dropped. This module holds those three text operations; the corpus
readers (:mod:`data_pipelines.amazon`, :mod:`data_pipelines.squad`) apply them.
"""

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


# pySBD's time grows faster than linearly with the text (500/1000/2000 sentences: 0.3/0.95/
# 5.3 s), so a one-line 1.5 MB document would never finish: longer texts are split a window
# of this many characters at a time.
_WINDOW_CHARS = 2000


def _last_start(window: str, sentences: list[str]) -> int:
    """Offset in ``window`` of the last of pySBD's ``sentences``, or 0 when it cannot be
    placed (pySBD with ``clean=False`` returns pieces of the text, in order)."""
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
    """Splits English text into sentences with pySBD (rule-based, offline).

    Uses ``pysbd.Segmenter(language="en", clean=False)`` (Sadvilkar & Neumann 2020), so the
    text is not rewritten; each sentence is stripped of surrounding whitespace and empty
    pieces are dropped. pySBD's time grows faster than linearly with the text length, so a
    text over 2,000 characters is split one 2,000-character window at a time: the window's
    sentences but its last (which may be cut short) are kept and the next window starts
    where that last one starts; a window that is one sentence is cut after its last line
    break, else at its last whitespace, else hard.

    Args:
      text: any text (a review, a paragraph).

    Returns:
      The sentences in order; ``[]`` for empty or whitespace-only text.
    """
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
    """The surface forms of an entity name that :func:`remove_entity_name` removes.

    The name itself, then the name with each trailing parenthesised part dropped in turn
    ("Toy Story (1995)" -> "Toy Story"; "Sky (United Kingdom)" -> "Sky"), and, for each of
    these, the MovieLens moved-article form put back in front ("Matrix, The (1999)" ->
    "The Matrix" and "Matrix"). Underscores (Wikipedia titles) count as spaces.

    Args:
      name: an entity name (movie title, article title).

    Returns:
      Distinct non-empty variants, longest first (so a longer form is removed before a
      shorter form it contains).
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
    # Whole-phrase match: no word character may touch the phrase on either side, which also
    # works for names that start or end with punctuation ("M*A*S*H", "Sky (United Kingdom)").
    # Inner whitespace of the name matches any run of whitespace in the text.
    alternatives = "|".join(r"\s+".join(re.escape(w) for w in v.split()) for v in variants)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def remove_entity_name(sentence: str, name: str) -> str:
    """Removes every whole-phrase, case-insensitive occurrence of an entity's name.

    DocEnt's rule "we remove movie names from their reviews" (Zemlyanskiy et al. 2021,
    section 4.4), so entity vectors must learn attributes rather than the name. Every form
    from :func:`entity_name_variants` is removed ("Toy Story (1995)" also removes "Toy
    Story"); a match must not be part of a longer word ("Toy Storyline" is kept). Runs of
    whitespace are then collapsed to one space and the ends stripped.

    Args:
      sentence: the text to clean.
      name: the entity's name; an empty name removes nothing.

    Returns:
      The cleaned sentence (possibly empty).
    """
    pattern = _name_pattern(name)
    if pattern is not None:
        sentence = pattern.sub(" ", sentence)
    return " ".join(sentence.split())


def count_words(text: str) -> int:
    """Number of whitespace-separated tokens in ``text``.

    The unit of DocEnt's "reviews shorter than 5 words" filter (section 4.4); the paper does
    not name its tokeniser, whitespace splitting is our reading.
    """
    return len(text.split())
