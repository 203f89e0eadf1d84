"""DocEnt corpus readers: text helpers, Amazon reviews, MovieLens, Reddit, Reviews2Movielens.

Amazon, Reddit and Reviews2Movielens cannot be shipped: the tests write small files in their
exact upstream formats. MovieLens is shipped and tested on the real files.
"""

from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pytest

from data_pipelines.errors import DataError
from data_pipelines.paths import data_dir
from data_pipelines.text import (
    count_words,
    entity_name_variants,
    remove_entity_name,
    split_sentences,
)
from docent_jax.corpora.amazon import (
    EntityVocab,
    ReviewCorpusStats,
    build_review_corpus,
    iter_amazon_reviews,
    iter_entity_sentences,
    select_entities,
)
from docent_jax.corpora.movielens import (
    human_cv_folds,
    read_genome_tags,
    read_links,
    read_movies,
    read_tags,
    tag_count_matrix,
)
from docent_jax.corpora.reddit import read_reddit_suggestions
from docent_jax.corpora.reviews2movielens import (
    canonical_asins,
    canonical_movielens_ids,
    canonical_names,
    read_reviews2movielens,
)

# ---------------------------------------------------------------- text


def test_split_sentences_handles_abbreviations():
    text = "Mr. Smith saw it in the U.S. last year.  He loved it! Did you?\n"
    assert split_sentences(text) == [
        "Mr. Smith saw it in the U.S. last year.", "He loved it!", "Did you?"
    ]
    assert split_sentences(" \n ") == []


def test_split_sentences_short_text_is_pysbd_unchanged():
    import pysbd

    text = ("Dr. Who met Mrs. Jones at 5 p.m. in Washington D.C. on Jan. 5. \"Really?\" "
            "she asked.\nThe end (i.e. fin). Another line without an end")
    reference = pysbd.Segmenter(language="en", clean=False).segment(text)
    assert split_sentences(text) == [s.strip() for s in reference if s.strip()]


def test_split_sentences_long_text_in_windows():
    # ~200 KB on one line: pySBD on the whole text takes minutes; windowed it is seconds.
    sentences = [f"Sentence {i} is about Mr. Smith's movie!" if i % 3 == 0 else
                 f"Is it {i} or so?" if i % 3 == 1 else "It was good (really) and i.e. fine."
                 for i in range(6400)]
    text = " ".join(sentences)
    assert len(text) > 200_000
    # Every window boundary falls inside some sentence, and none is cut there.
    assert split_sentences(text) == sentences
    # No sentence end anywhere: whitespace cuts, and nothing is lost.
    words = "word " * 1000 + "x" * 4500
    pieces = split_sentences(words)
    assert "".join("".join(pieces).split()) == "".join(words.split())
    assert max(map(len, pieces)) <= 2000 and pieces[-1] == "x" * 500


@pytest.mark.parametrize(
    ("sentence", "name", "expected"),
    [
        ("I loved TOY   story and Toy Story (1995)!", "Toy Story (1995)", "I loved and !"),
        ("Toy Storyline is not the name.", "Toy Story (1995)", "Toy Storyline is not the name."),
        ("The Matrix beats Matrix Reloaded", "Matrix, The (1999)", "beats Reloaded"),
        ("Watch M*A*S*H tonight", "M*A*S*H", "Watch tonight"),
        ("  spaced   out  ", "", "spaced out"),
    ],
)
def test_remove_entity_name(sentence, name, expected):
    assert remove_entity_name(sentence, name) == expected


def test_name_variants_and_word_count():
    assert entity_name_variants("Toy Story (1995)") == ["Toy Story (1995)", "Toy Story"]
    assert entity_name_variants("Sky_(United_Kingdom)") == ["Sky (United Kingdom)", "Sky"]
    assert count_words("  one two\tthree\nfour  ") == 4
    assert count_words("") == 0


# ---------------------------------------------------------------- Amazon reviews

FIVE = "this is five words long"


def _r2014(asin, reviewer, text, t=1203984000):
    # Key order and value types of reviews_Movies_and_TV_5.json (2014).
    return {
        "reviewerID": reviewer, "asin": asin, "reviewerName": "Some One", "helpful": [0, 0],
        "reviewText": text, "overall": 4.0, "summary": "a summary", "unixReviewTime": t,
        "reviewTime": "02 26, 2008",
    }


def _r2018(asin, reviewer, text, *, drop_text=False, vote=None):
    # Key order and value types of Movies_and_TV_5.json (2018); vote/image are optional.
    r = {
        "overall": 5.0, "verified": True, "reviewTime": "11 9, 2012", "reviewerID": reviewer,
        "asin": asin, "style": {"Format:": " VHS Tape"}, "reviewerName": "Terri",
        "reviewText": text, "summary": "Amazing!", "unixReviewTime": 1352419200,
    }
    if vote is not None:
        r["vote"] = vote
        r["image"] = ["https://images-na.ssl-images-amazon.com/images/I/x.jpg"]
    if drop_text:
        del r["reviewText"]
    return r


def _write_jsonl(path, records, *, gz=False, blank_after=None):
    lines = []
    for i, r in enumerate(records):
        lines.append(json.dumps(r) + "\n")
        if blank_after == i:
            lines.append("\n")
    data = "".join(lines).encode("utf-8")
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _records_2014():
    text = "Review {} of A Christmas Carol here."
    recs = [_r2014("0005019281", f"U{i}", text.format(i)) for i in range(5)]
    recs.append(_r2014("0005019281", "U9", "Too short"))  # 2 words: dropped
    recs += [_r2014("0307141985", f"U{i}", FIVE) for i in range(4)]  # 4 reviews: entity dropped
    return recs


def test_2014_plain_and_gzip_read_identically(tmp_path):
    recs = _records_2014()
    plain = _write_jsonl(tmp_path / "reviews.json", recs)
    # A gzip file without a .gz name: detection is by magic bytes.
    gz = _write_jsonl(tmp_path / "reviews_copy.json", recs, gz=True)
    a, b = list(iter_amazon_reviews(plain)), list(iter_amazon_reviews(gz))
    assert a == b and len(a) == 10
    assert (a[0].asin, a[0].reviewer_id, a[0].overall, a[0].unix_review_time) == (
        "0005019281", "U0", 4.0, 1203984000
    )


def test_2014_filters_and_name_removal(tmp_path):
    path = _write_jsonl(tmp_path / "reviews.json.gz", _records_2014(), gz=True)
    corpus = build_review_corpus(
        path, names={"0005019281": "A Christmas Carol (1984)"},
        sentence_splitter=lambda t: [t],
    )
    assert corpus.vocab.keys == ("0005019281",)
    assert corpus.stats == ReviewCorpusStats(
        reviews_read=10, short_reviews_dropped=1, entities_seen=2, entities_kept=1,
        reviews_kept=5, sentences=5,
    )
    assert corpus.sentences == [(0, f"Review {i} of here.") for i in range(5)]
    # The thresholds are parameters: with min_reviews=4 the second movie stays.
    vocab, stats = select_entities(path, min_reviews=4)
    assert vocab.keys == ("0005019281", "0307141985") and stats.reviews_kept == 9


def test_2018_missing_text_duplicates_and_blank_lines(tmp_path):
    recs = [_r2018("B01", f"U{i}", f"{FIVE}. Second sentence {i} here.") for i in range(5)]
    recs.append(_r2018("B01", "U0", f"{FIVE}. Second sentence 0 here."))  # exact duplicate
    recs.append(_r2018("B01", "U7", "", drop_text=True))  # 2018 rows may lack reviewText
    recs.append(_r2018("B02", "U1", FIVE, vote="11"))
    path = _write_jsonl(tmp_path / "Movies_and_TV_5.json", recs, blank_after=0)
    with pytest.raises(DataError) as info:
        list(iter_amazon_reviews(path))
    # Line 2 is blank, so the 7th record is on line 8.
    assert (info.value.line, info.value.field) == (8, "reviewText")
    assert str(path) in str(info.value)

    corpus = build_review_corpus(path, skip_invalid=True)
    assert corpus.stats.missing_review_text == 1
    assert corpus.stats.duplicates_dropped == 1
    assert corpus.stats.reviews_read == 8
    assert corpus.vocab.keys == ("B01",)
    assert len(corpus.sentences) == 10  # 5 reviews x 2 pySBD sentences
    assert corpus.sentences[:2] == [(0, f"{FIVE}."), (0, "Second sentence 0 here.")]
    kept = build_review_corpus(path, skip_invalid=True, deduplicate=False)
    assert kept.stats.duplicates_dropped == 0 and kept.stats.reviews_kept == 6


def test_aggregation_merges_editions_and_their_duplicates(tmp_path):
    recs = [_r2018("DVD", f"U{i}", f"{FIVE} {i}") for i in range(3)]
    recs += [_r2018("BLURAY", f"U{i}", f"{FIVE} {i}") for i in range(3)]  # same reviews
    recs += [_r2018("BLURAY", f"V{i}", f"{FIVE} v{i}") for i in range(2)]
    recs.append(_r2018("OTHER", "U1", FIVE))
    path = _write_jsonl(tmp_path / "r.json", recs)
    vocab, stats = select_entities(path, entity_of={"DVD": "MOVIE", "BLURAY": "MOVIE"})
    assert vocab.keys == ("MOVIE",)
    assert (stats.duplicates_dropped, stats.unmapped_dropped, stats.reviews_kept) == (3, 1, 5)
    # Without aggregation the editions stay apart: only BLURAY (3 + 2 reviews) reaches 5.
    vocab, stats = select_entities(path)
    assert vocab.keys == ("BLURAY",) and stats.duplicates_dropped == 0


def test_reader_streams_lazily_and_rejects_non_json(tmp_path):
    path = tmp_path / "r.json"
    good = json.dumps(_r2014("A", "U1", FIVE))
    path.write_text(f"{good}\n{good}\n{{'asin': 'A', 'reviewText': 'dict literal'}}\n")
    reviews = iter_amazon_reviews(path)
    assert next(reviews).line == 1 and next(reviews).line == 2
    with pytest.raises(DataError, match="Python dict literal") as info:
        next(reviews)
    assert info.value.line == 3
    path.write_text(json.dumps({"reviewText": FIVE}) + "\n")
    with pytest.raises(DataError, match="field 'asin'"):
        list(iter_amazon_reviews(path))


def test_entity_sentences_stream_uses_vocab_ids(tmp_path):
    recs = [_r2014("Z9", f"U{i}", f"Zed {i} is fine indeed.") for i in range(5)]
    recs += [_r2014("A1", f"U{i}", f"Aye {i} is fine indeed.") for i in range(5)]
    path = _write_jsonl(tmp_path / "r.json", recs)
    vocab, _ = select_entities(path)
    assert (vocab.id_of("A1"), vocab.id_of("Z9")) == (0, 1)
    stats = ReviewCorpusStats()
    pairs = list(iter_entity_sentences(path, vocab, names={"Z9": "Zed 3"}, stats=stats))
    assert pairs[0] == (1, "Zed 0 is fine indeed.")
    assert pairs[3] == (1, "is fine indeed.")
    assert pairs[5] == (0, "Aye 0 is fine indeed.")
    assert stats.sentences == 10


def test_entity_vocab_save_load(tmp_path):
    vocab = EntityVocab(["B00", "A10", "B00", "A2"])
    assert vocab.keys == ("A10", "A2", "B00") and len(vocab) == 3
    assert (vocab.id_of("A2"), vocab.key_of(2)) == (1, "B00")
    with pytest.raises(KeyError, match="'C'"):
        vocab.id_of("C")
    with pytest.raises(IndexError):
        vocab.key_of(3)
    path = tmp_path / "entities.txt"
    vocab.save(path)
    assert path.read_text() == "A10\nA2\nB00\n"
    assert EntityVocab.load(path) == vocab
    assert [p.name for p in tmp_path.iterdir()] == ["entities.txt"]  # no temp file left
    path.write_text("A10\nB00\nA2\n")
    with pytest.raises(DataError) as info:
        EntityVocab.load(path)
    assert info.value.line == 3
    with pytest.raises(ValueError):
        EntityVocab(["ok", "two\nlines"])


# ---------------------------------------------------------------- MovieLens (shipped, real)


@pytest.fixture(scope="module")
def movielens():
    return read_movies(), read_tags(), read_links(), read_genome_tags()


def _independent_counts():
    """(movieId, lowercased tag) -> set of users, from the raw CSV with the csv module."""
    folder = data_dir() / "movielens"
    with open(folder / "genome-tags.csv", newline="", encoding="utf-8") as f:
        vocab = {r["tag"].lower() for r in csv.DictReader(f)}
    cells: dict[tuple[int, str], set[int]] = {}
    with open(folder / "tags.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["tag"].strip().lower() in vocab:
                key = (int(r["movieId"]), r["tag"].strip().lower())
                cells.setdefault(key, set()).add(int(r["userId"]))
    return cells


def test_movielens_real_counts(movielens):
    movies, tags, links, genome = movielens
    assert len(movies) == 9742 and len(tags) == 3683 and len(genome) == 1128
    assert len({t.user_id for t in tags}) == 58
    assert movies[0].title == "Toy Story (1995)"
    assert movies[0].genres == ("Adventure", "Animation", "Children", "Comedy", "Fantasy")
    assert len(links) == 9742
    assert (links[0].imdb_id, links[0].tmdb_id) == ("0114709", 862)
    assert sum(link.tmdb_id is None for link in links) == 8
    assert (genome[0].tag_id, genome[0].tag, genome[-1].tag) == (1, "007", "zombies")
    assert tags[0].line == 2 and tags[0].path.endswith("tags.csv")


def test_tag_count_matrix_matches_independent_count(movielens):
    movies, tags, _, genome = movielens
    movie_ids = [m.movie_id for m in movies]
    vocab = [g.tag for g in genome]
    counts, stats = tag_count_matrix(tags, movie_ids, vocab)
    assert counts.shape == (9742, 1128) and counts.dtype == np.int32
    cells = _independent_counts()
    assert int(counts.sum()) == sum(len(u) for u in cells.values())
    assert int((counts > 0).sum()) == len(cells)
    assert int((counts >= 2).sum()) == sum(len(u) >= 2 for u in cells.values())
    row, col = movie_ids.index(60756), [t.lower() for t in vocab].index("funny")
    assert counts[row, col] == len(cells[(60756, "funny")])
    assert stats.applications == 3683
    assert stats.counted + stats.tag_not_in_vocab == 3683
    assert stats.movie_not_in_vocab == 0


def test_tag_count_matrix_hand_worked(tmp_path):
    path = tmp_path / "tags.csv"
    path.write_text(
        "userId,movieId,tag,timestamp\n"
        "1,10,Funny,100\n"
        "1,10,funny ,101\n"  # same user, same cell: counts once
        "2,10,FUNNY,102\n"
        "2,20,dark,103\n"
        "3,20,not a genome tag,104\n"
        "3,99,funny,105\n"  # movie outside the vocabulary
    )
    tags = read_tags(path)
    with pytest.raises(DataError) as info:
        tag_count_matrix(tags, [10, 20], ["dark", "funny"])
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 7, "movieId")
    counts, stats = tag_count_matrix(tags, [10, 20], ["dark", "funny"], skip_unknown_movies=True)
    assert counts.tolist() == [[0, 2], [1, 0]]
    assert (stats.counted, stats.tag_not_in_vocab, stats.movie_not_in_vocab) == (4, 1, 1)


def test_movielens_bad_rows(tmp_path):
    path = tmp_path / "movies.csv"
    path.write_text("movieId,title,genres\n1,A (1990),Drama\n1,B (1991),Comedy\n")
    with pytest.raises(DataError, match="already on line 2") as info:
        read_movies(path)
    assert (info.value.line, info.value.field) == (3, "movieId")
    path.write_text("movieId,title,genres\nx1,A (1990),Drama\n")
    with pytest.raises(DataError, match="expected an integer"):
        read_movies(path)


def test_human_cv_folds_reproduce_the_seeded_split(movielens):
    movies, tags, _, genome = movielens
    movie_ids = [m.movie_id for m in movies]
    vocab = [g.tag for g in genome]
    state_before = np.random.get_state()[1].copy()
    folds = human_cv_folds(tags, movie_ids, vocab)
    assert np.array_equal(np.random.get_state()[1], state_before)  # global RNG untouched

    # Independent recomputation of the authors' protocol.
    users = sorted({int(r.user_id) for r in tags})
    np.random.seed(31415)
    expected = np.array_split(np.random.permutation(users), 3)
    assert [f.users.tolist() for f in folds] == [e.tolist() for e in expected]
    assert [len(f.users) for f in folds] == [20, 19, 19]

    full, _ = tag_count_matrix(tags, movie_ids, vocab)
    for fold in folds:
        assert np.array_equal(fold.held_in + fold.others, full)
        members = set(fold.users.tolist())
        own, _ = tag_count_matrix([t for t in tags if t.user_id in members], movie_ids, vocab)
        assert np.array_equal(fold.held_in, own)
    assert sum(int(f.held_in.sum()) for f in folds) == int(full.sum())
    # Folds partition the users.
    assert sorted(u for f in folds for u in f.users.tolist()) == users


# ---------------------------------------------------------------- Reddit Movie Suggestions

REDDIT = [
    {
        "request": {
            "query_original": "Last week I watched Threads. Any similar movies?",
            "query_full": "Movies like Threads. Last week I watched Threads. Any similar movies?",
            "query_title": "Movies like Threads",
        },
        "response": {"result": [{"score": 12, "asin": "B001"}, {"score": 3.5, "asin": "B002"}]},
    },
    {
        "request": {"query_original": "", "query_full": "Feel-good comedies?",
                    "query_title": "Feel-good comedies?"},
        "response": {"result": [{"score": 1, "asin": "B999"}, {"score": 2, "asin": "B003"}]},
    },
    {
        "request": {"query_original": "x", "query_full": "Only unknown ones", "query_title": "x"},
        "response": {"result": [{"score": 1, "asin": "B998"}]},
    },
]


@pytest.fixture()
def reddit_vocab():
    return EntityVocab(["B001", "B002", "B003"])


def test_reddit_list_and_json_lines_agree(tmp_path, reddit_vocab):
    as_list = tmp_path / "reddit.json"
    as_list.write_text(json.dumps(REDDIT, indent=2))
    as_lines = tmp_path / "reddit.jsonl"
    as_lines.write_text("".join(json.dumps(r) + "\n" for r in REDDIT))
    a, stats = read_reddit_suggestions(as_list, reddit_vocab, skip_invalid=True)
    b, _ = read_reddit_suggestions(as_lines, reddit_vocab, skip_invalid=True)
    assert a == b
    assert [q.record for q in a] == [0, 1]
    assert a[0].asins == ("B001", "B002") and a[0].entity_ids == (0, 1)
    assert a[0].scores == (12.0, 3.5)
    assert a[1].asins == ("B003",) and a[1].query_full == "Feel-good comedies?"
    assert (stats.records, stats.unknown_results, stats.queries_without_results) == (3, 2, 1)


def test_reddit_unknown_asin_names_record(tmp_path, reddit_vocab):
    as_lines = tmp_path / "reddit.jsonl"
    as_lines.write_text("".join(json.dumps(r) + "\n" for r in REDDIT))
    with pytest.raises(DataError) as info:
        read_reddit_suggestions(as_lines, reddit_vocab)
    assert (info.value.line, info.value.field) == (2, "record[1].response.result[0].asin")
    bad = json.loads(json.dumps(REDDIT))
    del bad[0]["request"]["query_title"]
    as_list = tmp_path / "reddit.json"
    as_list.write_text(json.dumps(bad))
    with pytest.raises(DataError) as info:
        read_reddit_suggestions(as_list, reddit_vocab)
    assert (info.value.line, info.value.field) == (None, "record[0].request.query_title")


def test_reddit_maps_asins_to_canonical_entities(tmp_path):
    path = tmp_path / "reddit.json"
    path.write_text(json.dumps(REDDIT[:1]))
    vocab = EntityVocab(["CANON1", "CANON2"])
    queries, _ = read_reddit_suggestions(
        path, vocab, entity_of={"B001": "CANON2", "B002": "CANON1"}
    )
    assert queries[0].entity_ids == (1, 0)


# ---------------------------------------------------------------- Reviews2Movielens

R2M_HEADER = "asin,canon_asin,imdb_id,movielens_id,name,imdb_url\n"
R2M_ROWS = (
    "B00004CK40,B00004CK40,tt0114709,1,Toy Story,https://www.imdb.com/title/tt0114709/\n"
    "B00005JLXH,B00004CK40,tt0114709,1,Toy Story,https://www.imdb.com/title/tt0114709/\n"
    '6300215571,6300215571,tt0113497,2,"Jumanji, the movie",\n'
    "B0000DUMMY,B0000DUMMY,,999999,Not In MovieLens,\n"
)


def test_reviews2movielens_reads_and_checks(tmp_path):
    path = tmp_path / "Reviews2Movielens.csv"
    path.write_text(R2M_HEADER + R2M_ROWS)
    with pytest.raises(DataError) as info:
        read_reviews2movielens(path, movie_ids={1, 2})
    assert (info.value.line, info.value.field) == (5, "movielens_id")
    rows, stats = read_reviews2movielens(path, movie_ids={1, 2}, skip_invalid=True)
    assert [r.asin for r in rows] == ["B00004CK40", "B00005JLXH", "6300215571"]
    assert rows[2].name == "Jumanji, the movie" and rows[2].imdb_url == ""
    assert (stats.rows, stats.unknown_movielens_ids, stats.unknown_asins) == (4, 1, 0)
    assert canonical_asins(rows) == {
        "B00004CK40": "B00004CK40", "B00005JLXH": "B00004CK40", "6300215571": "6300215571"
    }
    assert canonical_names(rows) == {"B00004CK40": "Toy Story", "6300215571": "Jumanji, the movie"}
    assert canonical_movielens_ids(rows) == {"B00004CK40": 1, "6300215571": 2}

    known = EntityVocab(["B00004CK40", "6300215571"])
    with pytest.raises(DataError) as info:
        read_reviews2movielens(path, known_asins=known)
    assert (info.value.line, info.value.field) == (3, "asin")
    rows, stats = read_reviews2movielens(
        path, known_asins=known, asin_field="canon_asin", movie_ids={1, 2}, skip_invalid=True
    )
    assert len(rows) == 3 and stats.unknown_asins == 0


def test_reviews2movielens_bad_rows(tmp_path):
    path = tmp_path / "r2m.csv"
    path.write_text(R2M_HEADER + R2M_ROWS.splitlines(keepends=True)[0] * 2)
    with pytest.raises(DataError, match="already mapped on line 2") as info:
        read_reviews2movielens(path)
    assert info.value.line == 3
    path.write_text(R2M_HEADER + "A,A,tt1,one,Name,\n")
    with pytest.raises(DataError, match="expected an integer") as info:
        read_reviews2movielens(path)
    assert info.value.field == "movielens_id"
    path.write_text("asin,canon_asin,movielens_id,name,imdb_url\nA,A,1,N,\n")
    with pytest.raises(DataError, match="required column missing"):
        read_reviews2movielens(path)
    path.write_text(R2M_HEADER + "A,A,tt1,1,Name,\nB,A,tt2,2,Name,\n")
    rows, _ = read_reviews2movielens(path)
    with pytest.raises(ValueError, match="line 2"):
        canonical_movielens_ids(rows)


@pytest.mark.parametrize("damage", ["truncated", "trailing garbage"])
def test_a_damaged_gzip_review_file_is_named_not_a_traceback(tmp_path, damage):
    lines = [json.dumps({"reviewerID": f"u{i}", "asin": "B1", "reviewText": f"review {i} " * 40})
             for i in range(200)]
    data = gzip.compress("\n".join(lines).encode())
    path = tmp_path / "reviews.json.gz"
    path.write_bytes(data[:len(data) // 2] if damage == "truncated" else data + b"garbage")
    with pytest.raises(DataError, match=r"reviews\.json\.gz:\d+: .*corrupt or truncated gzip"):
        list(iter_amazon_reviews(path))
