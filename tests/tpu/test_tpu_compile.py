"""The TPU compiler (libtpu, ``make install-tpu``) builds the tiny-BERT DualCSE step and the
DocEnt tiled step for ``v5e:2x2`` and ``v4:2x2x1``: memory within the chip, collectives
of the expected kinds over the expected mesh axes (``make test-tpu``; skipped with one
line where libtpu is not installed)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tpu_compile  # noqa: E402

pytestmark = pytest.mark.tpu_compile
SLICES = ["v5e:2x2", "v4:2x2x1"]
ENTITIES = 524_288  # a 64 MiB float32 table at width 32: larger than any other collective


@pytest.fixture(scope="module", autouse=True)
def _libtpu():
    why = tpu_compile.unavailable()
    if why:
        pytest.skip(why)


def _by_kind(result, kind, axis=None):
    return [c for c in result["collectives"]
            if c["kind"] == kind and (axis is None or c["axis"] == axis)]


@pytest.mark.parametrize("slice_name", SLICES)
def test_dualcse_step_compiles_for_tpu(slice_name):
    import tpu_cases

    from dualcse_jax.configs import cross_tpu

    devices, chip = tpu_compile.topology(slice_name)
    mesh = tpu_compile.mesh_of(devices)
    config = cross_tpu.get_config()
    config.max_length, config.batch_size = 16, 8 * mesh.size  # one chunk of 8 per device
    encoder = tpu_cases.encoder_config(tpu_cases.TINY_BERT)
    compiled, examples = tpu_cases.dualcse_step(config, encoder, mesh)
    # 8 sentences a premise, float32
    _check_data_parallel(tpu_compile.analyse(compiled, mesh, chip, examples), chip,
                         vectors=config.batch_size * 8 * encoder.hidden_size * 4)


def _check_data_parallel(result, chip, vectors: int) -> None:
    """Fits the chip; data parallel only: the gradient is summed over "data", and in-batch
    negatives gather the vectors (and their text ids), never more than ``vectors`` bytes."""
    assert result["device_kind"] == chip.device_kind
    assert 0 < result["hbm_bytes"] <= chip.hbm_bytes
    assert result["flops"] > 0 and result["step_time_bound_s"] > 0
    assert {c["axis"] for c in result["collectives"]} <= {"data", "permute"}
    assert _by_kind(result, "all-reduce", "data")
    gathers = _by_kind(result, "all-gather", "data")
    assert gathers and max(c["max_op_bytes"] for c in gathers) <= vectors


@pytest.mark.parametrize("slice_name", SLICES)
def test_sentence_step_compiles_for_tpu(slice_name):
    """sentence-jax's cached MNRL preset (anchor, positive, hard negative): data parallel,
    the gradient summed over "data", the embeddings gathered at most once in full."""
    import tpu_cases

    from sentence_jax.configs import mnrl_tpu

    devices, chip = tpu_compile.topology(slice_name)
    mesh = tpu_compile.mesh_of(devices)
    config = mnrl_tpu.get_config()
    config.max_seq_length, config.batch_size = 16, 8 * mesh.size  # one chunk of 8 a device
    encoder = tpu_cases.encoder_config(tpu_cases.TINY_BERT)
    compiled, examples = tpu_cases.sentence_step(config, encoder, mesh)
    # 3 texts a row, float32
    _check_data_parallel(tpu_compile.analyse(compiled, mesh, chip, examples), chip,
                         vectors=config.batch_size * 3 * encoder.hidden_size * 4)


def _docent_tiled(slice_name, fused, rule=None):
    import tpu_cases

    from docent_jax.configs import dual_tpu

    devices, chip = tpu_compile.topology(slice_name)
    mesh = tpu_compile.mesh_of(devices, model=2)
    config = dual_tpu.get_config()
    config.update(max_length=16, batch_size=8 * mesh.shape["data"], softmax="full_vocab",
                  vocab_block_size=4096, fused_table_update=fused, mesh_model=2,
                  contrastive_chunk_size=0)
    if rule is not None:  # e.g. [("entities", "")]: the table replicated
        config.logical_axis_rules = rule
    encoder = tpu_cases.encoder_config(tpu_cases.TINY_BERT)
    compiled, examples = tpu_cases.docent_step(config, encoder, mesh, num_entities=ENTITIES)
    return tpu_compile.analyse(compiled, mesh, chip, examples), chip, encoder


def _check_table_split(result, chip, encoder):
    table = ENTITIES * encoder.hidden_size * 4
    assert result["device_kind"] == chip.device_kind
    assert 0 < result["hbm_bytes"] <= chip.hbm_bytes
    # The table, split by rows over "model": scores are all-reduced over it, never the
    # table; no collective moves a whole table (a replicated one's gradient would).
    assert not [c for c in _by_kind(result, "all-gather", "model")
                if c["max_op_bytes"] >= table // 2]
    assert _by_kind(result, "all-reduce", "model")
    assert max(c["max_op_bytes"] for c in result["collectives"]) < table
    # A device holds its half of the table and of its two AdamW moments (1.5 tables).
    assert result["arg_bytes"] / chip.cores < 2 * table


@pytest.mark.parametrize("slice_name,fused", [("v5e:2x2", False), ("v4:2x2x1", False),
                                              ("v5e:2x2", True)])
def test_docent_tiled_step_keeps_the_table_split(slice_name, fused):
    _check_table_split(*_docent_tiled(slice_name, fused))


def test_tpu_plan_prints_each_case_and_a_json_last_line(tmp_path, capsys):
    import json

    import tpu_plan

    results = tmp_path / "plan.json"
    tpu_plan.main(["--tiny", "--presets=cross_tpu,ranking", "--generations=v5e",
                   f"--results={results}"])
    lines = capsys.readouterr().out.strip().splitlines()
    last = json.loads(lines[-1])
    assert sorted(last) == ["cross_tpu@v5e:8x8", "ranking@v5e:8x8"]
    for case in last.values():
        assert case["device_kind"] == "TPU v5 lite" and case["chips"] == 64
        assert {"hbm_bytes", "hbm_capacity_bytes", "fits", "flops", "collective_bytes",
                "step_time_bound_s", "mfu_bound"} <= set(case)
        assert 0 < case["step_time_bound_s"] and 0 < case["mfu_bound"] <= 1
    # A second run reuses both cases (same inputs) and says so.
    tpu_plan.main(["--tiny", "--presets=cross_tpu,ranking", "--generations=v5e",
                   f"--results={results}"])
    out = capsys.readouterr().out
    assert out.count("kept from an earlier run with the same inputs") == 2
    assert json.loads(out.strip().splitlines()[-1]) == last
