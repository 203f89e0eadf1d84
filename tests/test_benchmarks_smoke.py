"""The accelerator benchmark keeps working on CPU (`--smoke`), and its PyTorch peer computes
the loss our step computes; the CPU comparison (bench_dualcse.py) runs both OpenMP wait
policies and counts sentence-transformers' padding as it batches; cpu_bench.py runs each
side in its own process and its float32 sides' vectors agree with sentence-transformers'."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "accelerator.py"
CPU_BENCH = ROOT / "benchmarks" / "bench_dualcse.py"
SEPARATE_BENCH = ROOT / "benchmarks" / "cpu_bench.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accelerator():
    return _load(SCRIPT, "accelerator_bench")


def test_analytic_flops_hand_worked():
    acc = _accelerator()
    # BERT-base, one sequence of 128: K = 12 (4·768² + 2·768·3072) = 84,934,656 weights.
    shape = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12}
    forward = 2 * 84_934_656 * 128 + 4 * 12 * 128 * 768 * 128
    assert acc.analytic_flops(shape, 128, 128, train=False) == forward
    assert acc.analytic_flops(shape, 128, 128, train=True) == 3 * forward
    assert acc.peak_tflops("NVIDIA H200")[0] == pytest.approx(989.4)
    assert acc.peak_tflops("NVIDIA H100 PCIe")[0] == pytest.approx(756.5)
    assert acc.peak_tflops("cpu")[0] is None


def test_torch_peer_loss_equals_dualcse_loss():
    torch = pytest.importorskip("torch")
    from dualcse_jax.loss import dualcse_loss

    rng = np.random.default_rng(0)
    r, u = rng.normal(size=(2, 5, 4, 8)).astype(np.float32)
    text_ids = np.arange(20, dtype=np.int32).reshape(5, 4)
    text_ids[3, 1] = text_ids[0, 1]  # a duplicate positive: masked out of denominators
    text_ids[4, 3] = text_ids[2, 3]
    import jax

    ours, _ = jax.jit(lambda r, u, t: dualcse_loss(r, u, t, temperature=0.05))(r, u, text_ids)
    peer = _accelerator().torch_dualcse_loss(torch.from_numpy(r), torch.from_numpy(u),
                                             torch.from_numpy(text_ids).long(), 0.05)
    np.testing.assert_allclose(float(peer), float(ours), rtol=1e-5)


def test_accelerator_smoke_workers_in_process(capsys):
    """The in-process side of the test below: ``--smoke``'s JAX and torch workers (the
    script starts each in a child process) in this process, and their summary."""
    bench = _accelerator()
    results = {}
    for worker in ("jax", "torch"):
        assert bench.main(["--smoke", "--worker", worker]) == 0
        results[worker] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert "error" not in results[worker], results[worker]
    _check_smoke_report({"jax": results["jax"],
                         "summary": bench.summarise(results["jax"], results["torch"], None)})


@pytest.mark.slow
def test_accelerator_smoke_runs_on_cpu():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, not the suite's eight
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    _check_smoke_report(json.loads(proc.stdout.strip().splitlines()[-1]))


def _check_smoke_report(report: dict) -> None:
    train, encode = report["jax"]["train"]["4"], report["jax"]["encode"]
    # The smoke model: 1 layer, d 64, FFN 128, length 16; 4 examples x 8 fields x 16 tokens.
    tokens = 4 * 8 * 16
    forward = 2 * (4 * 64 * 64 + 2 * 64 * 128) * tokens + 4 * 16 * 64 * tokens
    assert train["flops"] == 3 * forward
    # XLA counts the same matmuls plus elementwise ops and AdamW: at least ours, not far above.
    assert 1.0 <= train["xla_over_analytic"] < 1.5
    assert 1.0 <= encode["xla_over_analytic"] < 1.5
    for workload in ("train_b4", "encode"):
        row = report["summary"][workload]
        assert row["jax_tflops"] > 0 and row["torch_tflops"] > 0 and row["jax_over_torch"] > 0


def test_sentence_transformers_slots_hand_worked():
    bench = _load(CPU_BENCH, "bench_dualcse")
    # Sorted by characters (50, 40, 30, 20, 10), not tokens: token lengths 4, 9 | 8, 11 | 3
    # -> 2·9 + 2·11 + 1·3 = 43 slots (sorting by tokens would give 2·11 + 2·8 + 3 = 41).
    texts = ["a" * 10, "b" * 30, "c" * 20, "d" * 50, "e" * 40]
    tokens = [3, 8, 11, 4, 9]
    assert bench.sentence_transformers_slots(texts, tokens, 2) == 43
    assert bench.sentence_transformers_slots(texts, tokens, 5) == 5 * 11
    assert bench.sentence_transformers_slots(texts, tokens, 1) == sum(tokens)


@pytest.mark.bench_run  # minutes: make test-bench, not the default run
def test_cpu_bench_runs_both_wait_policies():
    pytest.importorskip("sentence_transformers")
    from dualcse_jax.configs import default

    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the bench sets its own
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
    proc = subprocess.run([sys.executable, str(CPU_BENCH), "--sentences", "64",
                           "--train-steps", "2", "--repeats", "1"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("encode_ratio", "train_ratio", "encode_ratio_active", "train_ratio_active",
                "load_average_start", "load_average_end", "cpu_model", "xla_flags"):
        assert key in report, key
    assert report["padding_jax"] >= 1.0 and report["padding_torch"] >= 1.0
    assert report["omp_wait_policy"] == ["PASSIVE", "ACTIVE"]
    threads = len(os.sched_getaffinity(0))
    assert report["threads"] == threads
    for key, policy in (("passive", "PASSIVE"), ("active", "ACTIVE")):
        child = report[key]
        assert child["omp_wait_policy"] == policy
        assert child["torch_threads"] == threads and child["torch_interop_threads"] == 1
        assert len(child["xla_cpus"]) == threads
        assert child["train"]["dropout_impl"] == default.get_config().dropout_impl
    # Same texts, same batches: both children count the same slots.
    assert (report["passive"]["encode"]["jax_slots"]
            == report["active"]["encode"]["jax_slots"])
    assert report["encode_ratio"] == report["passive"]["encode"]["ratio"]
    assert report["train_ratio_active"] == report["active"]["train"]["ratio"]


def test_cpu_bench_length_mix_and_spreads():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sides = _load(ROOT / "benchmarks" / "cpu_bench_sides.py", "cpu_bench_sides")
    bench = _load(SEPARATE_BENCH, "cpu_bench")
    sentences = [f"s{i}" for i in range(10)]
    paragraphs = [f"p{i}" for i in range(5)]
    texts = sides.length_mix(sentences, paragraphs, 8, 0.25)
    # round(8 * 0.25) = 2 paragraphs, the first 6 sentences, nothing twice; same seed, same mix.
    assert sorted(t for t in texts if t.startswith("s")) == sorted(sentences[:6])
    assert len({t for t in texts if t.startswith("p")}) == 2 and len(texts) == 8
    assert texts == sides.length_mix(sentences, paragraphs, 8, 0.25)
    with pytest.raises(ValueError, match="need 4 sentences and 6 paragraphs"):
        sides.length_mix(sentences, paragraphs, 10, 0.6)
    assert bench.spread([3.0, 1.0, 2.0, 10.0]) == [1.0, 2.5, 10.0]
    quick = bench.parse_args(["--quick", "--threads", "1"])
    assert (quick.repeats, quick.texts, quick.threads) == (1, 24, 1)
    assert bench.parse_args(["--texts", "5"]).repeats == 3


@pytest.mark.bench_run  # minutes: make test-bench, not the default run
def test_cpu_bench_quick_each_side_in_its_own_process():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the bench sets its own
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
    proc = subprocess.run([sys.executable, str(SEPARATE_BENCH), "--quick"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("encode_ratio_torch", "encode_ratio_onnx", "train_ratio_torch", "cpu_model",
                "cpu_flags", "threads", "spreads", "int8", "max_abs_diff_vs_st_torch"):
        assert report[key] is not None, key
    assert report["threads"] == len(os.sched_getaffinity(0))
    assert report["max_seq_length"] == 256  # the MiniLM folder's own
    diffs = report["max_abs_diff_vs_st_torch"]
    assert diffs["ours"] < 1e-4 and diffs["st_onnx"] < 1e-4, diffs
    # int8 is a different model: off by more than float32 rounding, yet the same vectors.
    assert 1e-4 < report["int8"]["max_abs_error_vs_st_torch"] < 0.5
    for name in ("encode/ours", "encode/st_torch", "encode/st_onnx", "encode/st_onnx_int8",
                 "train/ours", "train/st_torch"):
        lo, med, hi = report["spreads"][name]
        assert 0 < lo <= med <= hi, name
    med = {k: v[1] for k, v in report["spreads"].items()}
    assert report["encode_ratio_onnx"] == pytest.approx(med["encode/ours"]
                                                        / med["encode/st_onnx"])
    assert report["train_ratio_torch"] == pytest.approx(med["train/ours"]
                                                        / med["train/st_torch"])


HAND_HLO = """HloModule jit_step, entry_computation_layout={()->f32[]}

%fused_transpose (param_0: f32[4,8]) -> f32[8,4] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %transpose.1 = f32[8,4]{0,1} transpose(%param_0), dimensions={1,0}
  ROOT %bitcast.1 = f32[8,4]{1,0} bitcast(%transpose.1)
}

%fused_hash (param_0.1: u32[16]) -> u32[16] {
  %param_0.1 = u32[16]{0} parameter(0)
  %constant.1 = u32[] constant(16)
  %broadcast.1 = u32[16]{0} broadcast(%constant.1), dimensions={}
  %shift-right-logical.1 = u32[16]{0} shift-right-logical(%param_0.1, %broadcast.1)
  ROOT %xor.1 = u32[16]{0} xor(%param_0.1, %shift-right-logical.1)
}

%fused_gelu (param_0.2: f32[4,8]) -> f32[4,8] {
  %param_0.2 = f32[4,8]{1,0} parameter(0)
  ROOT %multiply.1 = f32[4,8]{1,0} multiply(%param_0.2, %param_0.2), metadata={op_name="gelu/mul"}
}

%fused_bias (param_0.3: f32[4,8]) -> f32[4,8] {
  %param_0.3 = f32[4,8]{1,0} parameter(0)
  ROOT %add.2 = f32[4,8]{1,0} add(%param_0.3, %param_0.3)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%a, %b)
}

%fused_reduce (param_0.4: f32[4,8]) -> f32[4] {
  %param_0.4 = f32[4,8]{1,0} parameter(0)
  %constant.2 = f32[] constant(0)
  ROOT %reduce.1 = f32[4]{0} reduce(%param_0.4, %constant.2), dimensions={1}, to_apply=%add
}

ENTRY %main (p0: f32[4,8], p1: u32[16], p2: f32[8,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = u32[16]{0} parameter(1)
  %p2 = f32[8,8]{1,0} parameter(2)
  %transpose_fusion = f32[8,4]{1,0} fusion(%p0), kind=kLoop, calls=%fused_transpose
  %hash_fusion = u32[16]{0} fusion(%p1), kind=kLoop, calls=%fused_hash
  %gelu_fusion = f32[4,8]{1,0} fusion(%p0), kind=kLoop, calls=%fused_gelu
  %bias_fusion = f32[4,8]{1,0} fusion(%p0), kind=kLoop, calls=%fused_bias
  %reduce_fusion = f32[4]{0} fusion(%p0), kind=kInput, calls=%fused_reduce
  ROOT %dot.1 = f32[4,8]{1,0} dot(%p0, %p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_train_step_profile_classifies_hand_written_hlo():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    profile = _load(ROOT / "benchmarks" / "train_step_profile.py", "train_step_profile")
    instrs, comps, module = profile.parse_hlo(HAND_HLO)
    assert module == "jit_step"
    assert instrs["dot.1"]["root"] and instrs["dot.1"]["opcode"] == "dot"
    assert instrs["hash_fusion"]["called"] == ["fused_hash"]
    got = {name: profile.classify(name, instrs, comps) for name in (
        "transpose_fusion", "hash_fusion", "gelu_fusion", "bias_fusion", "reduce_fusion",
        "dot.1", "no_such_op")}
    assert got == {"transpose_fusion": "transpose/copy", "hash_fusion": "dropout mask",
                   "gelu_fusion": "gelu", "bias_fusion": "elementwise",
                   "reduce_fusion": "reductions", "dot.1": "matmul", "no_such_op": "unmatched"}
