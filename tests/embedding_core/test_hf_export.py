"""export-hf: HF / sentence-transformers folders equal the trained models (docs/export.md).

The round trip pretrained -> ours -> HF -> ours is exact; after runs of 2-3 steps,
``SentenceTransformer(folder).encode`` equals ``load(workdir).encode`` (DualCSE cross with
the indicator in the tokenizer and a tanh head, bi with mean pooling and normalisation,
DocEnt-Dual with a projection), and transformers loads every folder in a process that
never imports JAX.
"""

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from data_pipelines.tokenization import load_tokenizer, tokenize
from embedding_core.models import pretrained
from embedding_core.models.encoders import EncoderConfig
from embedding_core.serving import hf_export
from tests import shared_runs
from tests.gcs_emulator import BUCKET

TEXTS = ["A man is playing a guitar.", "the cat",
         # Longer than max_length (32): truncated alike on both sides, indicator kept.
         "It rained all day long and the streets of the old town were flooded, so nobody "
         "went out to the market that morning or on the morning after that one either."]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
# 2 steps on the shipped 17-row example files: a cheap run (no INLI tokenisation).
DUALCSE = {"max_length": 32, "batch_size": 8, "num_train_steps": 2, "checkpoint_every": 2,
           "log_every": 1, "learning_rate": 1e-3, "eval_every": 0, "eval_batch_size": 16,
           "warmup_steps": 0, "train_file": str(EXAMPLES / "my_pairs.csv")}


# ----------------------------------------------------------------- weights, config, tokens


def test_minilm_round_trip_names_shapes_and_values(minilm_dir, tmp_path):
    """pretrained -> ours -> HF -> ours is exact, with MiniLM's own names and shapes."""
    pre = pretrained.load_pretrained(minilm_dir)
    original = load_file(str(minilm_dir / "model.safetensors"))
    tensors = hf_export.hf_tensors(pre.params, pre.config)
    kept = {k: v for k, v in original.items() if k != "embeddings.position_ids"
            and not k.startswith("pooler.")}
    assert sorted(tensors) == sorted(kept)
    for name, value in kept.items():
        assert tensors[name].shape == value.shape, name
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    # hf_name inverts the loader's renaming, path by path.
    for path in pretrained.param_shapes(pre.config):
        name, transpose = hf_export.hf_name(path)
        assert pretrained._flax_path(name) == (path, transpose)
    # Written and read back by the loader: the same tree; the config reads back equal.
    hf_export._save_tensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(hf_export.hf_config(pre.config)))
    again = pretrained.load_pretrained(tmp_path)
    assert again.config == pre.config
    import jax

    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(pre.params),
                            jax.tree_util.tree_leaves(again.params), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_wrong_tree_is_refused_with_every_problem_named(minilm_dir):
    pre = pretrained.load_pretrained(minilm_dir)
    small = EncoderConfig.from_hf_config(minilm_dir).replace(num_layers=5)
    with pytest.raises(ValueError, match=r"5 layers, hidden 384: unexpected encoder/layer_5/"):
        hf_export.hf_tensors(pre.params, small)
    params = dict(pre.params, embeddings=dict(pre.params["embeddings"]))
    del params["embeddings"]["LayerNorm"]
    with pytest.raises(ValueError, match="missing embeddings/LayerNorm/scale"):
        hf_export.hf_tensors(params, pre.config)


def _roberta_like() -> Tokenizer:
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4, "b": 5, "c": 6,
             "explicit": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


@pytest.mark.parametrize("which", ["bert", "roberta"])
def test_suffix_template_reads_a_text_as_the_pair(which, minilm_dir):
    """One text through the exported tokenizer = the (text, indicator) pair the run
    tokenises, truncation included (only the text is cut)."""
    tokenizer = load_tokenizer(minilm_dir) if which == "bert" else _roberta_like()
    suffix = "implicit" if which == "bert" else "explicit"
    texts = ["a b c", "a " * 40 + "b"]
    exported = Tokenizer.from_str(
        hf_export.tokenizer_files(tokenizer, 12, suffix)["tokenizer.json"].decode())
    exported.enable_truncation(12)
    want = tokenize(tokenizer, texts, 12, pair=suffix)
    for i, text in enumerate(texts):
        got = exported.encode(text)
        n = int(want.lengths[i])
        assert got.ids == want.input_ids[i, :n].tolist()
        assert got.type_ids == want.token_type_ids[i, :n].tolist()
    assert n == 12  # the long text was cut to 12 tokens, the indicator kept
    assert hf_export.special_tokens(tokenizer)["pad_token"] == ("[PAD]" if which == "bert"
                                                                else "<pad>")


def test_roberta_folder_equals_our_encoder(tmp_path):
    """A RoBERTa encoder (positions from pad_token_id + 1, one token type) exported with a
    RoBERTa-style tokenizer: sentence-transformers' mean-pooled vectors equal ours."""
    import jax.numpy as jnp
    import torch
    from transformers import RobertaConfig, RobertaModel

    from embedding_core.models.encoders import TransformerEncoder
    from embedding_core.serving.inference import masked_mean

    torch.manual_seed(0)
    RobertaModel(RobertaConfig(vocab_size=8, hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=32,
                               max_position_embeddings=16, type_vocab_size=1, pad_token_id=1,
                               bos_token_id=0, eos_token_id=2)).save_pretrained(tmp_path / "base")
    pre = pretrained.load_pretrained(tmp_path / "base")
    tokenizer = _roberta_like()
    hf_export.write_sentence_transformer(
        tmp_path / "out", encoder_params=pre.params, encoder_config=pre.config,
        tokenizer=tokenizer, max_length=12, head=hf_export.SentenceHead("mean"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["RobertaModel"] and config["type_vocab_size"] == 1
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (1, 0, 2)
    texts = ["a b c", "c a", "b " * 20]  # the last one is cut to 12 tokens
    tok = tokenize(tokenizer, texts, 12)
    mask = (np.arange(12)[None] < tok.lengths[:, None]).astype(np.int32)
    hidden = TransformerEncoder(pre.config).apply(
        {"params": pre.params}, jnp.asarray(tok.input_ids), jnp.asarray(mask),
        jnp.asarray(tok.token_type_ids)).last_hidden_state
    want = np.asarray(masked_mean(hidden, jnp.asarray(mask)))
    np.testing.assert_allclose(_st(tmp_path / "out").encode(texts), want, atol=1e-5)


# --------------------------------------------------------------------------- trained runs


def _train_dualcse(tmp_path_factory, model_dir, **fields):
    from dualcse_jax import workflows
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update(dict(DUALCSE, model=str(model_dir), **fields))
    workdir = tmp_path_factory.mktemp("dualcse") / "run"
    workflows.train(config, workdir)
    out = workdir.parent / "hf"
    workflows.export_hf_workdir(workdir, out)
    return workdir, out


@pytest.fixture(scope="module")
def cross(tmp_path_factory, dualcse_tiny_run):
    """DualCSE-cross, SimCSE's tanh head (``cls_mlp``), raw vectors: the session's shared
    3-step run (tests/shared_runs.py), exported outside its read-only workdir."""
    over = dualcse_tiny_run.overrides  # what the tests below rely on
    assert (over["architecture"], over["pooling"], over["normalize"], over["max_length"]) == \
        ("cross", "cls_mlp", False, 32)
    from dualcse_jax import workflows

    out = tmp_path_factory.mktemp("dualcse_hf") / "hf"
    workflows.export_hf_workdir(dualcse_tiny_run.workdir, out)
    return dualcse_tiny_run.workdir, out


@pytest.fixture(scope="module")
def bi(tmp_path_factory, tiny_bert_dir):
    """DualCSE-bi, mean pooling, unit vectors."""
    return _train_dualcse(tmp_path_factory, tiny_bert_dir, architecture="bi",
                          pooling="mean", normalize=True)


@pytest.fixture(scope="module")
def docent(tmp_path_factory, docent_tiny_run):
    """DocEnt-Dual with a 16-wide projection after CLS pooling: the session's shared
    3-step run (tests/shared_runs.py), exported outside its read-only workdir."""
    from docent_jax import workflows

    over = docent_tiny_run.overrides  # what the tests below rely on
    assert (over["variant"], over["pooling"], over["projection_dim"]) == ("dual", "cls", 16)
    out = tmp_path_factory.mktemp("docent_hf") / "hf"
    workflows.export_hf_workdir(docent_tiny_run.workdir, out)
    return docent_tiny_run.workdir, out


def _st(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def test_cross_views_equal_encode(cross):
    from dualcse_jax import load
    from embedding_core.serving.st_models import load_encoder

    workdir, out = cross
    assert sorted(p.name for p in out.iterdir()) == ["explicit", "implicit"]
    emb = load(workdir)
    for kind in ("explicit", "implicit"):
        model = _st(out / kind)
        np.testing.assert_allclose(model.encode(TEXTS), emb.encode(TEXTS, kind=kind),
                                   atol=1e-5, err_msg=kind)
        # load_encoder reads the folder as sentence-transformers does: the indicator word's
        # token type (1) from the tokenizer's template included.
        np.testing.assert_allclose(load_encoder(out / kind).encode(TEXTS),
                                   emb.encode(TEXTS, kind=kind), atol=1e-5, err_msg=kind)
        modules = json.loads((out / kind / "modules.json").read_text())
        assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Dense"]
        info = json.loads((out / kind / hf_export.INFO_FILE).read_text())
        assert info["input_suffix"] == kind
        assert info["step"] == shared_runs.DUALCSE_TINY["num_train_steps"]
    r, u = emb.encode(TEXTS, kind="explicit"), emb.encode(TEXTS, kind="implicit")
    assert np.abs(r - u).max() > 1e-4  # the two views really differ
    # Both folders hold the one encoder; only their tokenizers differ.
    assert (out / "explicit" / "model.safetensors").read_bytes() == \
        (out / "implicit" / "model.safetensors").read_bytes()


def test_bi_views_equal_encode(bi):
    from dualcse_jax import load

    workdir, out = bi
    emb = load(workdir)
    for kind in ("explicit", "implicit"):
        got = _st(out / kind).encode(TEXTS)
        np.testing.assert_allclose(got, emb.encode(TEXTS, kind=kind), atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
        config = json.loads((out / kind / "1_Pooling" / "config.json").read_text())
        assert config["pooling_mode_mean_tokens"] and not config["pooling_mode_cls_token"]
    # Two encoders, two weight files.
    assert (out / "explicit" / "model.safetensors").read_bytes() != \
        (out / "implicit" / "model.safetensors").read_bytes()


def test_docent_queries_and_entities(docent):
    from docent_jax import load
    from embedding_core.serving.export_reader import load_view

    workdir, out = docent
    ranker = load(workdir)
    got = _st(out).encode(TEXTS)
    assert got.shape == (3, 16)
    np.testing.assert_allclose(got, ranker.encode(TEXTS), atol=1e-5)
    table, ids, meta = load_view(out / "entities")
    np.testing.assert_array_equal(table, ranker.entity_embeddings())
    assert ids == ranker.entity_ids
    assert meta["step"] == shared_runs.DOCENT_TINY["num_train_steps"]
    # score = a * cos(f(q), g(e)), a recorded in export_info.json.
    scale = json.loads((out / hf_export.INFO_FILE).read_text())["scale"]
    cos = (got / np.linalg.norm(got, axis=1, keepdims=True)) @ \
        (table / np.linalg.norm(table, axis=1, keepdims=True)).T
    np.testing.assert_allclose(scale * cos, ranker.score(TEXTS), rtol=1e-4, atol=1e-4)


def _pooler_outputs(cross, bi, docent) -> dict:
    """folder -> the pooler_output transformers must give for ``TEXTS[:2]`` (DualCSE-cross's
    exported BERT pooler is its r / u, the cls_mlp head), or None: only loaded."""
    from dualcse_jax import load

    workdir, out = cross
    emb = load(workdir)
    folders = {str(out / kind): emb.encode(TEXTS[:2], kind=kind).tolist()
               for kind in ("explicit", "implicit")}
    folders.update({str(bi[1] / "explicit"): None, str(docent[1]): None})
    return folders


def _check_auto_models(folders: dict, texts: list[str]) -> int:
    """AutoModel + AutoTokenizer on each folder: 32-wide states and the pooler output
    asked for; the number of folders. Self-contained: the slow test runs its source in a
    fresh process."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    for folder, want in folders.items():
        model = AutoModel.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        with torch.no_grad():
            out = model(**tokenizer(texts, padding=True, return_tensors="pt"))
        assert out.last_hidden_state.shape[-1] == 32, folder
        if want is not None:
            got = out.pooler_output.numpy().tolist()
            err = max(abs(a - b) for x, y in zip(got, want, strict=True)
                      for a, b in zip(x, y, strict=True))
            assert err < 1e-5, (folder, err)
    return len(folders)


def test_transformers_loads_every_folder(cross, bi, docent):
    """AutoModel + AutoTokenizer in this process: the CLS state of DualCSE-cross's exported
    BERT pooler is r / u (its cls_mlp head); the slow test below does it without JAX."""
    assert _check_auto_models(_pooler_outputs(cross, bi, docent), TEXTS[:2]) == 4


@pytest.mark.slow
def test_transformers_loads_every_folder_without_jax(cross, bi, docent, tmp_path):
    """The same in a fresh process, which never imports JAX."""
    script = inspect.getsource(_check_auto_models) + textwrap.dedent("""
        import json, sys
        folders, texts = json.loads(sys.argv[1])
        count = _check_auto_models(folders, texts)
        assert "jax" not in sys.modules and "flax" not in sys.modules
        print("ok", count)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-c", script,
                           json.dumps([_pooler_outputs(cross, bi, docent), TEXTS[:2]])],
                          capture_output=True, text=True, timeout=1800, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "4"]


# --------------------------------------------------------------------------- the output


def test_existing_output_is_refused_before_any_work(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        with hf_export.staged_output(out):
            raise AssertionError("the block must not run")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_failure_leaves_no_output_and_no_staging(tmp_path):
    out = tmp_path / "sub" / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with hf_export.staged_output(out) as stage:
            (stage / "config.json").write_text("{}")
            raise RuntimeError("boom")
    assert not out.exists() and list((tmp_path / "sub").iterdir()) == []
    with hf_export.staged_output(out) as stage:
        (stage / "a" / "b").mkdir(parents=True)
        (stage / "a" / "b" / "c.json").write_text("{}")
    assert (out / "a" / "b" / "c.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["out"]
    assert oct((out / "a").stat().st_mode & 0o777) != oct(0o700)


def test_gs_output_uploaded_whole(gcs_emulator, monkeypatch):
    from embedding_core.storage import storage

    out = f"gs://{BUCKET}/hf_export/out"
    with hf_export.staged_output(out) as stage:
        (stage / "1_Pooling").mkdir()
        for name in ("config.json", "modules.json", "model.safetensors", "1_Pooling/config.json"):
            (stage / name).write_text(name)
    assert storage.as_path(out + "/1_Pooling/config.json").read_text() == "1_Pooling/config.json"
    # An upload failing half-way removes what was uploaded.
    calls = []
    real = storage.upload

    def flaky(src, dest):
        calls.append(dest)
        if len(calls) == 3:
            raise OSError("network down")
        real(src, dest)

    monkeypatch.setattr(storage, "upload", flaky)
    out2 = f"gs://{BUCKET}/hf_export/out2"
    with pytest.raises(OSError, match="network down"):
        with hf_export.staged_output(out2) as stage:
            for name in ("config.json", "modules.json", "model.safetensors", "tokenizer.json"):
                (stage / name).write_text(name)
    assert not storage.as_path(out2).exists()
    assert os.fspath(calls[-1]).endswith("config.json")  # modules/config go last


def test_cli_export_hf_is_wired_and_refuses_a_used_output_in_one_line(tmp_path, cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = cli("dualcse_jax.main", "export-hf", f"--workdir={tmp_path / 'no_run'}",
               f"--output={out}")
    assert done.returncode == 1, done.stderr
    assert f"export-hf: error: --output {out} exists and is not an empty folder" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("docent_jax.main", "export-hf", f"--workdir={tmp_path}")
    assert done.returncode == 1 and "export-hf needs --output=DIR" in done.stderr


def test_load_encoder_takes_our_workdirs_and_save_writes_export_hf(cross, docent, tmp_path):
    import embedding_core
    from dualcse_jax import load
    from embedding_core.serving import workdirs

    workdir, out = cross
    model = embedding_core.load_encoder(str(workdir))
    assert type(model) is type(load(workdir)) and workdirs.method_of(workdir) == "dualcse"
    np.testing.assert_allclose(model.encode(TEXTS, kind="implicit"),
                               load(workdir).encode(TEXTS, kind="implicit"), atol=0)
    model.save(tmp_path / "saved")  # the same folders as export-hf, loadable as they are
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["explicit", "implicit"]
    np.testing.assert_allclose(_st(tmp_path / "saved" / "implicit").encode(TEXTS),
                               _st(out / "implicit").encode(TEXTS), atol=0)
    with pytest.raises(FileExistsError):
        model.save(tmp_path / "saved")
    assert workdirs.method_of(docent[0]) == "docent"
    assert embedding_core.load_encoder(docent[0]).name.startswith("DocEnt")


def test_method_of_tells_the_methods_apart_by_their_config_fields(tmp_path):
    from docent_jax.configs import default as docent_default
    from embedding_core.serving import workdirs
    from mrwe_jax.configs import default as mrwe_default

    for name, config in (("mrwe", mrwe_default.get_config()),
                         ("docent", docent_default.get_config())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run_config.json").write_text(json.dumps(config.to_dict()))
        assert workdirs.method_of(tmp_path / name) == name
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "run_config.json").write_text(json.dumps({f"x{i}": i for i in range(5)}))
    with pytest.raises(ValueError, match="no installed method has these config fields"):
        workdirs.method_of(tmp_path / "other")


def test_evaluate_gives_the_same_numbers_on_a_workdir_and_its_export_hf_folder(cross, tmp_path,
                                                                              cli):
    """embedding-jax evaluate on a workdir's view and on that view's export-hf folder."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from eval_data import write_eval_files

    from embedding_core.evaluation import cli as evaluate_cli

    workdir, out = cross
    files = write_eval_files(tmp_path / "data")
    flags = [f"--{kind}={path}" for kind, path in files.items()]
    assert evaluate_cli.main([f"--model={workdir}", "--view=implicit", *flags,
                              f"--output={tmp_path / 'workdir.json'}"]) == 0
    assert evaluate_cli.main([f"--model={out / 'implicit'}", *flags,
                              f"--output={tmp_path / 'hf.json'}"]) == 0
    a = json.loads((tmp_path / "workdir.json").read_text())["results"]
    b = json.loads((tmp_path / "hf.json").read_text())["results"]
    assert sorted(a) == sorted(b) == ["ir", "pairs", "sts", "triplets"]
    for kind in a:
        assert a[kind]["metrics"].keys() == b[kind]["metrics"].keys()
        for name, value in a[kind]["metrics"].items():
            assert value == pytest.approx(b[kind]["metrics"][name], abs=1e-5), (kind, name)
    assert "cosine_ndcg@10" in a["ir"]["metrics"] and "spearman_cosine" in a["sts"]["metrics"]
    assert evaluate_cli.main([f"--model={workdir}", "--view=nope", *flags]) == 1
    # The package's own evaluate takes the same flags and runs only those evaluators.
    done = cli("dualcse_jax.main", "evaluate", f"--workdir={workdir}", "--view=implicit",
               *flags, f"--output={tmp_path / 'package.json'}", env={"XLA_FLAGS": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    c = json.loads((tmp_path / "package.json").read_text())["results"]
    for kind in a:
        assert c[kind]["metrics"] == pytest.approx(a[kind]["metrics"], abs=1e-6), kind
    assert "RTE" not in done.stdout  # its own protocol is not run on top
