"""Every ``*_tpu.py`` preset trains 2 steps on the 8 fake CPU devices with the tiny BERT in
place of BERT-base (``--config.model=``): the preset's batch, chunking, remat and dtype as
they are; only the model, the step count, the global batch (one GradCache chunk per CPU
device: 8 devices x the preset's chunk) and (DocEnt, MRWE) a small data file change.

Compiling a BERT-base preset's remat / GradCache step takes 15-45 s on 2 cores, so the
DualCSE, DocEnt and sentence-jax runs are in the slow tier; the default tier builds and
lowers the same steps (``benchmarks/tpu_cases.py``, as ``run`` builds them) on the 8 CPU
devices without compiling them, and runs the MRWE presets (cheap to compile)."""

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

PRESETS = ["dualcse_jax.configs.cross_tpu", "dualcse_jax.configs.bi_tpu",
           "dualcse_jax.configs.simcse_tpu", "docent_jax.configs.dual_tpu",
           "docent_jax.configs.full_tpu", "docent_jax.configs.hybrid_tpu",
           "mrwe_jax.configs.convrr_tpu", "mrwe_jax.configs.fcrr_tpu",
           "sentence_jax.configs.mnrl_tpu"]
BERT_BASE = "google-bert/bert-base-uncased"


def _docent_docs(path):
    """64 entities x 20 sentences."""
    words = ["river", "castle", "music", "engine", "forest", "garden", "bridge", "market"]
    lines = [json.dumps({"entity": f"E{e}", "text": f"The {words[e % 8]} {e} is seen at "
                                                    f"hour {k} by {words[k % 8]}."})
             for e in range(64) for k in range(20)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _mrwe_pairs(path):
    """100 passages, 4 questions each."""
    words = ["river", "castle", "music", "engine", "forest", "garden", "bridge", "market"]
    lines = []
    for p in range(100):
        passage = (f"Passage {p} tells of the {words[p % 8]} and the {words[(p // 8) % 8]} "
                   f"near town {p}.")
        lines += [json.dumps({"question": f"Where is the {words[(p + q) % 8]} of town {p}?",
                              "passage": passage}) for q in range(4)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


SLOW = {p for p in PRESETS if not p.startswith("mrwe_jax")}


@pytest.mark.parametrize("preset", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW
                                    else p for p in PRESETS])
def test_tpu_preset_trains_two_steps_on_cpu(preset, tiny_bert_dir, tmp_path):
    module = importlib.import_module(preset)
    package = preset.split(".")[0]
    config = module.get_config()
    settings = {k: config.get(k) for k in ("remat", "dtype", "max_length", "max_seq_length",
                                           "contrastive_chunk_size", "paragraphs_per_batch")}
    overrides = {"num_train_steps": 2, "eval_every": 0, "log_every": 1}
    if package == "mrwe_jax":
        from mrwe_jax.workflows import train

        assert config.contextual_model == BERT_BASE
        overrides.update(contextual_model=str(tiny_bert_dir), contextual_layers="-2,-1",
                         train_file=str(_mrwe_pairs(tmp_path / "pairs.jsonl")))
    else:
        assert config.model == BERT_BASE
        assert config.dtype == "bfloat16" and config.remat != "none"
        overrides["model"] = str(tiny_bert_dir)
        overrides["batch_size"] = 8 * (config.contrastive_chunk_size or 8)
        if package == "sentence_jax":
            from sentence_jax.trainer import train
            from tests.sentence_jax.test_training import _triplets

            overrides["train_files"] = str(_triplets(tmp_path / "t.csv", n=128))
        elif package == "docent_jax":
            from docent_jax.trainer import train

            overrides.update(train_data="squad",  # the preset's "amazon" names review files
                             train_file=str(_docent_docs(tmp_path / "docs.jsonl")))
        else:
            from dualcse_jax.workflows import train

            overrides["max_train_examples"] = 2 * overrides["batch_size"]
    config.update(overrides)
    state = train(config, tmp_path / "run")
    assert int(state.step) == 2
    saved = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert {k: saved.get(k) for k in settings} == settings
    losses = [json.loads(line) for line in
              (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_losses = [m["loss"] for m in losses if "loss" in m]
    assert len(train_losses) == 2 and np.isfinite(train_losses).all(), losses


@pytest.mark.parametrize("preset", sorted(SLOW))
def test_tpu_preset_step_lowers_on_8_cpu_devices(preset):
    """The slow test's step, traced and lowered for 8 devices: the preset's dtype reaches
    the program and GradCache chunks loop (``contrastive_chunk_size``)."""
    import jax
    from jax.sharding import Mesh

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tpu_cases

    config = importlib.import_module(preset).get_config()
    config.batch_size = 8 * (config.contrastive_chunk_size or 8)
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(8, 1), ("data", "model"))
    encoder = tpu_cases.encoder_config(tpu_cases.TINY_BERT)
    package = preset.split(".")[0]
    if package == "docent_jax":
        lowered, examples = tpu_cases.docent_step(config, encoder, mesh, num_entities=64,
                                                  compile=False)
    else:
        build = tpu_cases.sentence_step if package == "sentence_jax" else tpu_cases.dualcse_step
        lowered, examples = build(config, encoder, mesh, compile=False)
    assert examples == config.batch_size
    text = lowered.as_text()
    assert config.dtype == "bfloat16" and "bf16" in text
    if config.get("contrastive_chunk_size"):
        assert "stablehlo.while" in text
