# ruff: noqa: E501  (HLO lines as the compiler writes them)
"""``benchmarks/tpu_compile.collectives`` on hand-written HLO in the TPU compiler's syntax:
replica groups in its three notations named by mesh axis, loop bodies counted by their
bound, an async collective counted once (no libtpu needed: the default tier)."""

import sys
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tpu_compile  # noqa: E402

HLO = """HloModule jit_step

%body (p: (s32[], f32[8,4])) -> (s32[], f32[8,4]) {
  %ar.1 = f32[8,4]{1,0:T(8,128)} all-reduce(%x), channel_id=3, replica_groups={{0,2},{1,3}}, to_apply=%add
  ROOT %t = (s32[], f32[8,4]) tuple(%i, %ar.1)
}

%cond (p: (s32[], f32[8,4])) -> pred[] {
  %constant.7 = s32[]{:T(128)} constant(5)
  ROOT %lt = pred[]{:T(512)} compare(%i, %constant.7), direction=LT
}

%async_a (p: f32[2,16]) -> f32[4,16] {
  %all-gather.9 = f32[4,16]{1,0:T(8,128)} all-gather(%p), channel_id=9, replica_groups=[2,2]<=[4], dimensions={0}
}

%async_b (p: f32[2,16]) -> f32[4,16] {
  %all-gather.10 = f32[4,16]{1,0:T(8,128)S(1)} all-gather(%p), channel_id=9, replica_groups=[2,2]<=[4], dimensions={0}
}

ENTRY %main (a: f32[8,4]) -> f32[8,4] {
  %w = (s32[], f32[8,4]) while(%init), condition=%cond, body=%body
  %c1 = f32[4,16] custom-call(%a), custom_call_target="AsyncCollectiveFusion", called_computations={%async_a}
  %c2 = f32[4,16] custom-call(%a), custom_call_target="AsyncCollectiveFusion", called_computations={%async_b}
  %all-reduce.2 = (bf16[16]{0}, f32[], /*index=2*/f32[2]{0}) all-reduce(%a, %b, %c), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0','axis_1'}, to_apply=%add
  %ar.5 = f32[3]{0} all-reduce(%a), channel_id=5, replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_0'}, to_apply=%add
  %cp = f32[6]{0} collective-permute(%a), channel_id=6, source_target_pairs={{0,1},{1,0}}
  ROOT %o = f32[8,4] copy(%a)
}
"""


def _mesh():
    """A 2 x 2 ("data", "model") mesh; the parser only reads its shape and axis names."""
    devices = np.array(jax.devices()[:4], dtype=object).reshape(2, 2)
    return Mesh(devices, ("data", "model"))


def test_collectives_by_axis_loop_counts_and_async_duplicates():
    found = {(c["kind"], c["axis"]): c for c in tpu_compile.collectives(HLO, _mesh())}
    # Loop body: 8 x 4 float32 = 128 bytes, 5 runs (the bound of its condition), over
    # data ({0,2},{1,3}: positions d * 2 + m with m fixed).
    assert found[("all-reduce", "data")]["bytes"] == 5 * 128
    assert found[("all-reduce", "data")]["count"] == 5
    # device_ids=([2,2]T(1,0)) {'axis_0'}: {0,1},{2,3}, the model axis (next test).
    assert found[("all-reduce", "model")]["bytes"] == 3 * 4
    # mesh[...] {'axis_0','axis_1'}: every device; bf16[16] + f32[] + f32[2] = 44 bytes.
    assert found[("all-reduce", "data+model")]["bytes"] == 32 + 4 + 8
    # [2,2]<=[4]: {0,1},{2,3}, the model axis; one async op in two computations: once.
    assert found[("all-gather", "model")] == {"kind": "all-gather", "axis": "model",
                                              "bytes": 4 * 16 * 4, "count": 1,
                                              "max_op_bytes": 256}
    assert found[("collective-permute", "permute")]["bytes"] == 24
    assert len(found) == 5


def test_device_ids_permutation_names_the_axis():
    # device_ids=([2,2]T(1,0)) lists the mesh's devices as 0,2,1,3: 'axis_0' of that order
    # pairs {0,1} and {2,3}, which is the model axis of a 2 x 2 mesh, not data.
    line = ("replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) "
            "{'axis_0'}")
    assert tpu_compile._groups(line, 4) == frozenset({frozenset({0, 1}), frozenset({2, 3})})
    assert tpu_compile._groups("replica_groups={{0,2},{1,3}}", 4) == frozenset(
        {frozenset({0, 2}), frozenset({1, 3})})
    assert tpu_compile._groups("replica_groups=[1,4]<=[4]", 4) == frozenset(
        {frozenset({0, 1, 2, 3})})


def test_loop_bodies_are_reported():
    assert tpu_compile.loop_bodies(HLO) == 1
