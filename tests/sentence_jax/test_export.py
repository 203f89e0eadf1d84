"""A sentence-jax run's folder: sentence-transformers loads it and encodes as we do (its own
pooling and Normalize kept, Matryoshka truncate_dim), and its model card names the run."""

from __future__ import annotations

import numpy as np
import pytest

from sentence_jax import inference, trainer
from sentence_jax.configs import default
from tests.sentence_jax.test_training import _triplets

TEXTS = ["A man is playing a guitar.", "Rain is expected tomorrow.", "question number 3"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, minilm_dir):
    """Two MNRL steps of MiniLM (mean pooling + Normalize) with Matryoshka 384, 128 and a
    prompt on the anchor column."""
    root = tmp_path_factory.mktemp("st_export")
    config = default.get_config()
    config.update(model=str(minilm_dir), train_files=str(_triplets(root / "t.csv")),
                  batch_size=8, max_seq_length=32, num_train_steps=2, checkpoint_every=2,
                  matryoshka_dims="384,128", learning_rate=1e-3,
                  prompts='{"anchor": "query: "}')
    trainer.train(config, root / "run")
    encoder = inference.load(root / "run")
    encoder.save(root / "model")
    return encoder, root / "model"


def test_sentence_transformers_loads_the_folder_and_encodes_as_we_do(run, minilm_dir):
    from sentence_transformers import SentenceTransformer

    encoder, folder = run
    ours = encoder.encode(TEXTS)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)  # Normalize
    base = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS)
    assert np.abs(theirs - base).max() > 1e-3  # the trained weights, not the base model's
    short = SentenceTransformer(str(folder), device="cpu", truncate_dim=128).encode(TEXTS)
    np.testing.assert_allclose(short, theirs[:, :128], atol=1e-6)


def test_the_model_card_renders_the_run(run):
    _, folder = run
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: sentence-transformers" in card
    for line in ("- **Matryoshka dimensions:** 384, 128", "### Loss: `MatryoshkaLoss`",
                 "t.csv`: 16 rows, columns anchor, positive, negative",
                 '"loss": "MultipleNegativesRankingLoss"', "- `batch_size`: 8",
                 "- **Output Dimensionality:** 384 dimensions"):
        assert line in card, line


def test_the_prompt_trained_with_is_in_the_folder(run):
    from sentence_transformers import SentenceTransformer

    encoder, folder = run
    model = SentenceTransformer(str(folder), device="cpu")
    assert model.prompts["anchor"] == "query: " and encoder.prompts == {"anchor": "query: "}
    np.testing.assert_allclose(encoder.encode(TEXTS, prompt_name="anchor"),
                               model.encode(TEXTS, prompt_name="anchor"), atol=2e-5)
    assert np.abs(model.encode(TEXTS, prompt_name="anchor") - model.encode(TEXTS)).max() > 1e-3


def test_training_texts_carry_their_prompt(tmp_path, tiny_bert_dir):
    from data_pipelines.tokenization import load_tokenizer

    config = default.get_config()
    config.update(model=str(tiny_bert_dir), train_files=str(_triplets(tmp_path / "t.csv")),
                  batch_size=8, max_seq_length=16, prompts='{"t.csv": {"positive": "doc: "}}')
    batch = next(iter(trainer.build_task(config).make_batches(0)))
    tokenizer = load_tokenizer(tiny_bert_dir)
    decoded = [[tokenizer.decode(batch[f"input_ids_{c}"][r, 0].tolist()) for c in range(2)]
               for r in range(len(batch["input_ids_0"]))]
    assert all(r[1].startswith("doc : answer") and r[0].startswith("question") for r in decoded)
