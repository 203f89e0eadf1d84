"""Where the CPU time of ``bench_dualcse.py``'s train step goes, by category of XLA op.

Each variant is ``setup_train_jax``'s supervised-SimCSE step with ``config.dropout_impl``
set. Timing: interleaved rounds (A on all ``--steps`` batches, then B, ...): median wall and
process-CPU s per step, ratio to the first variant (> 1: slower). Profile: ``--trace-steps``
steps each under ``jax.profiler.trace``: the Perfetto XLA op events (``args.hlo_op``) of all
threads, top-level only (a ``while`` owns its body's), mapped through the compiled HLO (a
fusion by every op it calls), first match wins: matmul (dot, convolution, dot / oneDNN / XNN /
YNN custom call); dropout mask (u32 xor + shift-right-logical: the hash, threefry and its
while loops; rng ops); transpose/copy (root under bitcasts); reductions (reduce,
reduce-window); gelu (erf / erfc opcode or op_name: XLA expands erf); other (gather,
scatter, pad, slice, concatenate, sort, loops, ...); elementwise (other loop fusions / ops).
Thread ms per step (threads summed: includes descheduled time on a loaded machine) and
shares of traced op time. Last line: one JSON object (``--json PATH``: the full report).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_driver  # noqa: E402
import bench_dualcse  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jaxlib  # noqa: E402

from embedding_core.distributed import parallel  # noqa: E402
from embedding_core.training import training  # noqa: E402

CATEGORIES = ("matmul", "dropout mask", "transpose/copy", "reductions", "gelu", "elementwise",
              "other", "unmatched")
MOVES = {"gather", "scatter", "pad", "slice", "concatenate", "dynamic-slice",
         "dynamic-update-slice", "sort", "reverse"}
_COMP = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s+(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_CALLS = re.compile(r"\b(?:calls|body|condition|to_apply)=%([\w.\-]+)")
shape_key = lambda batch: tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


def _field(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    return m.group(1) if m else ""


def parse_hlo(text: str) -> tuple[dict, dict, str]:
    """``(instructions by name, computation -> instruction names, module name)``."""
    instrs, comps, comp = {}, collections.defaultdict(list), None
    for line in text.splitlines():
        if (m := _COMP.match(line)) and not line.startswith(" "):
            comp = m.group(1)
        elif (m := _INSTR.match(line)) and comp and (op := re.search(r"([a-z][a-z0-9\-]*)\(",
                                                                     m.group(3))):
            after = m.group(3)[op.end():]  # operands and attributes
            instrs[m.group(2)] = {"opcode": op.group(1), "root": bool(m[1]), "text": after,
                                  "dtype": _field(r"^\(?\s*([a-z]+\d*)\[", m.group(3)),
                                  "called": _CALLS.findall(after)}
            comps[comp].append(m.group(2))
    return instrs, comps, _field(r"HloModule\s+([\w.\-]+)", text)


def classify(name: str, instrs: dict, comps: dict) -> str:
    """The category of top-level instruction ``name`` (module docstring)."""
    if name not in instrs:
        return "unmatched"
    top, seen, stack, members = instrs[name], set(), list(instrs[name]["called"]), [name]
    while stack:  # every instruction reachable through called computations
        if (c := stack.pop()) not in seen:
            seen.add(c)
            members += comps.get(c, ())
            stack += [k for i in comps.get(c, ()) for k in instrs[i]["called"]]
    ops = [instrs[i] for i in members]
    opcodes = {o["opcode"] for o in ops}
    u32 = {o["opcode"] for o in ops if o["dtype"] == "u32"}
    targets = " ".join(_field(r'custom_call_target="([^"]*)"', o["text"]) for o in ops).lower()
    if opcodes & {"dot", "convolution"} or re.search(r"dot|onednn|xnn|ynn|matmul|gemm", targets):
        return "matmul"
    if ({"xor", "shift-right-logical"} <= u32 or opcodes & {"rng-bit-generator", "rng"}
            or re.search(r"threefry|rng", targets)):
        return "dropout mask"
    root = top
    if top["opcode"] == "fusion" and top["called"]:
        root = next((instrs[i] for i in comps.get(top["called"][0], ()) if instrs[i]["root"]),
                    top)
    while root["opcode"] in ("bitcast", "reshape") and (
            operand := _field(r"^\s*%([\w.\-]+)", root["text"])) in instrs:
        root = instrs[operand]
    if root["opcode"] in ("transpose", "copy"):
        return "transpose/copy"
    if opcodes & {"reduce", "reduce-window"}:
        return "reductions"
    if opcodes & {"erf", "erfc"} or any(re.search(r'op_name="[^"]*(/erfc?"|gelu)', o["text"])
                                        for o in ops):
        return "gelu"
    if opcodes & MOVES or top["opcode"] in ("while", "conditional", "call", "custom-call"):
        return "other"
    return ("elementwise" if top["opcode"] != "fusion" or "kind=kLoop" in top["text"]
            else "other")


def build(impl: str, steps: int) -> dict:
    """``setup_train_jax`` with ``dropout_impl=impl``; records what lowering its jitted step
    needs and the parsed compiled HLO per batch shape (from the jit cache)."""
    orig_config, orig_make = bench_dualcse._simcse_config, training.make_train_step
    seen: dict = {"args": {}}
    config = lambda: (c := orig_config()).update(dropout_impl=impl) or c

    def make(loss_fn, shardings, mesh, **kw):
        run = orig_make(loss_fn, shardings, mesh, **kw)
        seen.update(kw, jitted=run.jitted, mesh=mesh)  # kw: rules, when not the default

        def recorded(state, batch, rng):
            seen["args"].setdefault(shape_key(batch), jax.tree.map(lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=x.sharding), (state, batch, rng)))
            return run(state, batch, rng)
        return recorded

    bench_dualcse._simcse_config, training.make_train_step = config, make
    try:
        side = bench_dualcse.setup_train_jax(steps)
    finally:
        bench_dualcse._simcse_config, training.make_train_step = orig_config, orig_make
    assert side["dropout_impl"] == impl, side["dropout_impl"]
    with jax.set_mesh(seen["mesh"]), nn.logical_axis_rules(
            seen.get("rules", parallel.LOGICAL_AXIS_RULES)):
        hlo = {k: parse_hlo(seen["jitted"].lower(*a).compile().as_text())
               for k, a in seen["args"].items()}
    return {**side, "hlo": hlo}


def profile(v: dict, n: int) -> dict:
    """Thread ms per step by category and by op over ``n`` traced steps of variant ``v``."""
    batches = [v["batches"][i % len(v["batches"])] for i in range(n)]
    hlos = [v["hlo"][shape_key(b)] for b in batches]
    with tempfile.TemporaryDirectory(prefix="train_step_profile_") as tmp:
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0
        t = time.perf_counter()
        with jax.profiler.trace(tmp, create_perfetto_trace=True, profiler_options=opts):
            for b in batches:
                v["step"](b)
        wall = time.perf_counter() - t
        files = (glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)
                 or glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True))
        with gzip.open(files[0], "rt") as f:
            events = json.load(f)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})
           and e["args"].get("hlo_module") == hlos[0][2]]
    # executions in time order = the traced steps
    runs = list(dict.fromkeys(e["args"]["run_id"] for e in sorted(ops, key=lambda e: e["ts"])))
    if len(runs) != n:
        print(f"warning: {len(runs)} executions of {hlos[0][2]} traced, expected {n}")
    hlo_of_run = dict(zip(runs, hlos, strict=False))
    by_op, by_cat, cat_of = collections.Counter(), collections.Counter(), {}
    end = collections.defaultdict(lambda: -1.0)  # per thread: of its last top-level op
    for e in sorted(ops, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        if e["args"]["run_id"] not in hlo_of_run or e["ts"] < end[e["tid"]] - 1e-3:
            continue  # not a traced step, or nested in a top-level op (a while's body)
        end[e["tid"]], name = e["ts"] + e["dur"], e["args"]["hlo_op"]
        hlo = hlo_of_run[e["args"]["run_id"]]
        if (id(hlo), name) not in cat_of:  # op names belong to one compiled module
            cat_of[id(hlo), name] = cat_of[name] = classify(name, hlo[0], hlo[1])
        by_op[name] += e["dur"] / 1e3 / n
        by_cat[cat_of[id(hlo), name]] += e["dur"] / 1e3 / n
    total = sum(by_cat.values()) or 1.0
    return {"ms_per_step": {c: by_cat[c] for c in CATEGORIES}, "threads": len(end),
            "fraction": {c: by_cat[c] / total for c in CATEGORIES}, "op_ms_per_step": total,
            "traced_wall_ms_per_step": wall * 1e3 / n,
            "top_ops": [(k, cat_of[k], round(ms, 2)) for k, ms in by_op.most_common(8)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dropout-impl", action="append", metavar="IMPL[,IMPL]", help="hash "
                        "| flax, repeated or a comma list (default flax,hash; first: reference)")
    parser.add_argument("--steps", type=int, default=8, help="batches per timing round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--trace-steps", type=int, default=4, help="profiled steps per variant")
    parser.add_argument("--json", metavar="PATH", help="also write the full report here")
    args = parser.parse_args()
    impls = list(dict.fromkeys(i.strip() for arg in (args.dropout_impl or ["flax,hash"])
                               for i in arg.split(",") if i.strip()))
    if bad := [i for i in impls if i not in ("hash", "flax")]:
        parser.error(f"--dropout-impl {bad}: choose from hash, flax")
    print(f"threads: {len(os.sched_getaffinity(0))} CPUs; jax {jax.__version__}, jaxlib "
          f"{jaxlib.__version__}; cpu: {bench_driver.cpu_model()}; load {os.getloadavg()[0]:.2f}")
    variants = {}
    for impl in impls:
        t = time.perf_counter()
        variants[impl] = build(impl, args.steps)
        print(f"built {impl}: {variants[impl]['shapes']} batch shapes, "
              f"{time.perf_counter() - t:.0f} s (compiles included)", flush=True)
    wall, cpu = collections.defaultdict(list), collections.defaultdict(list)
    for r in range(args.rounds):
        for impl, v in variants.items():
            t, c = time.perf_counter(), time.process_time()
            for b in v["batches"]:
                v["step"](b)
            wall[impl].append((time.perf_counter() - t) / len(v["batches"]))
            cpu[impl].append((time.process_time() - c) / len(v["batches"]))
        print(f"round {r + 1}: " + ", ".join(f"{i} {wall[i][-1]:.3f} s wall {cpu[i][-1]:.3f} s "
                                               f"CPU per step" for i in impls), flush=True)
    med = {i: (statistics.median(wall[i]), statistics.median(cpu[i])) for i in impls}
    timing = {i: {"wall_s": w, "cpu_s": c, "wall_ratio": w / med[impls[0]][0],
                  "cpu_ratio": c / med[impls[0]][1]} for i, (w, c) in med.items()}
    print(f"\n{'variant':9s}{'wall s/step':>13s}{'CPU s/step':>12s}{'wall ratio':>12s}"
          f"{'CPU ratio':>11s}   (medians of {args.rounds} rounds x {args.steps} steps; "
          f"ratios: / {impls[0]})")
    for i, t in timing.items():
        print(f"{i:9s}{t['wall_s']:13.3f}{t['cpu_s']:12.3f}{t['wall_ratio']:12.3f}"
              f"{t['cpu_ratio']:11.3f}")
    prof = {i: profile(v, args.trace_steps) for i, v in variants.items()}
    print(f"\nthread ms per step by category ({args.trace_steps} traced steps each, "
          "top-level XLA ops, all threads)")
    print(f"{'category':16s}" + "".join(f"{i + ' ms':>12s}{'%':>7s}" for i in impls))
    for c in CATEGORIES:
        print(f"{c:16s}" + "".join(f"{prof[i]['ms_per_step'][c]:12.1f}"
                                   f"{100 * prof[i]['fraction'][c]:6.1f}%" for i in impls))
    for label, key in (("total op time", "op_ms_per_step"),
                       ("traced wall", "traced_wall_ms_per_step")):
        print(f"{label:16s}" + "".join(f"{prof[i][key]:12.1f}{'':7s}" for i in impls))
    for i in impls:
        print(f"top ops {i} ({prof[i]['threads']} threads), ms/step: " + ", ".join(
            f"{n} [{c}] {ms:.0f}" for n, c, ms in prof[i]["top_ops"]))
    summary = {"variants": impls, "wall_ratio": {i: timing[i]["wall_ratio"] for i in impls},
               "cpu_ratio": {i: timing[i]["cpu_ratio"] for i in impls},
               "fractions": {i: {c: round(f, 4) for c, f in prof[i]["fraction"].items()}
                             for i in impls}}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**summary, "args": vars(args), "timing": timing, "profiles": prof,
                       "rounds": {"wall_s": wall, "cpu_s": cpu}}, f, indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
