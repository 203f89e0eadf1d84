"""The fourth method (unsup_simcse.py) trained, evaluated, exported and exported to HF by
the core's commands, each through the CLI as a user runs it."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from data_pipelines import inli

SCRIPT = Path(__file__).with_name("unsup_simcse.py")
ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(SCRIPT.parent))  # the method as a library, as a package would be


@pytest.fixture(scope="module", params=[
    "in_process", pytest.param("subprocess", marks=pytest.mark.slow)])
def _cli(request):
    """``python unsup_simcse.py ARGS``: in this process and, in the slow tier, as a child
    process on one CPU device (the run's own mesh)."""
    from tests import in_process

    if request.param == "in_process":
        return lambda *args: in_process.run_cli(str(SCRIPT), *args)
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    return lambda *args: in_process.run_subprocess(str(SCRIPT), *args, env=env)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir, _cli):
    out = tmp_path_factory.mktemp("fourth")
    examples = inli.read_inli(inli.inli_split_path("test"))[:24]
    (out / "sentences.txt").write_text("".join(e.premise + "\n" for e in examples))
    (out / "triplets.tsv").write_text("".join(
        f"{e.premise}\t{e.explicit_entailment}\t{e.contradiction}\n" for e in examples))
    workdir = out / "run"
    done = _cli("train", f"--workdir={workdir}", f"--config.model={tiny_bert_dir}",
                f"--config.train_file={out / 'sentences.txt'}",
                f"--config.eval_file={out / 'triplets.tsv'}", "--config.num_train_steps=3",
                "--config.checkpoint_every=3", "--config.learning_rate=1e-3")
    assert done.returncode == 0, done.stderr[-3000:]
    return out, workdir, [e.premise for e in examples]


def test_train_writes_the_declared_config_and_a_checkpoint(run):
    _, workdir, _ = run
    saved = json.loads((workdir / "run_config.json").read_text())
    assert saved["num_train_steps"] == 3 and saved["temperature"] == 0.05
    assert (workdir / "checkpoints" / "3").is_dir()


def test_evaluate_export_and_export_hf_agree_with_the_loaded_encoder(run, _cli):
    import unsup_simcse  # the same module as a library (the test's sys.path has it)

    out, workdir, sentences = run
    encoder = unsup_simcse.load(workdir)
    assert encoder.step == 3
    reference = encoder.encode(sentences)

    done = _cli("evaluate", f"--workdir={workdir}")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((workdir / "eval" / "triplets.json").read_text())
    rows = [line.split("\t") for line in (out / "triplets.tsv").read_text().splitlines()]
    a, p, n = (encoder.encode([r[i] for r in rows], normalize=True) for i in range(3))
    assert result["accuracy"] == pytest.approx(np.mean(np.sum(a * p, -1) > np.sum(a * n, -1)))

    done = _cli("export", f"--workdir={workdir}", f"--input={out / 'sentences.txt'}",
                f"--output={out / 'export'}")
    assert done.returncode == 0, done.stderr[-3000:]
    from embedding_core import load_export

    views = load_export(out / "export")
    vectors, ids, meta = views["sentence"]
    assert ids == sentences and meta["model"] == "unsup-SimCSE" and meta["step"] == 3
    np.testing.assert_allclose(vectors, reference, rtol=1e-5, atol=1e-5)

    done = _cli("export-hf", f"--workdir={workdir}", f"--output={out / 'hf'}")
    assert done.returncode == 0, done.stderr[-3000:]
    from sentence_transformers import SentenceTransformer

    torch_vectors = SentenceTransformer(str(out / "hf"), device="cpu").encode(sentences)
    np.testing.assert_allclose(torch_vectors, reference, rtol=1e-4, atol=1e-4)


def test_an_unknown_field_is_refused_and_nothing_is_written(tmp_path, tiny_bert_dir, _cli):
    import unsup_simcse

    c = unsup_simcse.FIELDS.config()
    c.batch_sz = 3
    with pytest.raises(ValueError, match=r"^config has no field 'batch_sz' \(did you mean "
                                         r"'batch_size'\?\)"):
        unsup_simcse.train(c, tmp_path / "w")
    assert not (tmp_path / "w").exists()
    done = _cli("train", f"--workdir={tmp_path / 'w'}", "--config.batch_sz=3")
    assert done.returncode == 1 and not (tmp_path / "w").exists()
    assert done.stderr.strip().splitlines()[-1] == f"error: {_message()}"


def _message() -> str:
    import unsup_simcse

    from embedding_core import unknown_field_message

    return unknown_field_message("batch_sz", unsup_simcse.FIELDS)


def test_the_method_imports_the_core_only_through_its_public_surface():
    """Every core import of the method and of this test is ``embedding_core`` itself, and
    every name it takes is on the surface (``embedding_core.__all__``)."""
    from tests.surface_imports import outside_surface

    assert [b for path in (SCRIPT, Path(__file__)) for b in outside_surface(path)] == []
