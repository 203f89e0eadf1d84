"""What each ``*_tpu.py`` preset needs on each TPU generation, from the TPU compiler.

Every case is compiled ahead of time by libtpu's compiler for a slice that is not here
(``benchmarks/tpu_compile.py``; ``make install-tpu`` installs the libtpu the installed jax
pins), on abstract inputs (``benchmarks/tpu_cases.py``). Per case it prints the device kind
the compiler built for, per-chip HBM (arguments + outputs + temporaries - donated) against
the chip's, FLOPs and HBM traffic (``cost_analysis``), the collectives of the optimised HLO
(kind, mesh axis, bytes per step) and a roofline bound on step time with the examples/s
per chip and the MFU it allows (``docs/performance.md``, "TPU compiler").

Cases: each preset's train step (DualCSE cross/bi/simcse, DocEnt dual/full/hybrid at the
paper's 81,057 entities; MRWE: its BERT-base feature pass), one ``encode`` batch and one
DocEnt ranking block, on v4, v5e, v5p and v6e at the slice the presets are sized for and
(``--sizes=all``) one smaller and one larger. ``--largest`` adds, per preset and
generation, the largest global batch that compiles within 90% of HBM. Results are kept in
``--results`` (JSON) as each case finishes; a re-run reuses a case only when its inputs
(preset config, slice, jax and libtpu versions, the packages' sources) are unchanged, and
says so.

  make install-tpu && python benchmarks/tpu_plan.py                 # named slices
  python benchmarks/tpu_plan.py --presets=cross_tpu --generations=v5e --largest
  python benchmarks/tpu_plan.py --tiny                               # tiny BERT, minutes

Last line: one JSON object ``{case: {hbm_bytes, hbm_capacity_bytes, fits, flops,
collective_bytes, step_time_bound_s, mfu_bound, ...}}`` (a case that failed: ``{"error"}``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import tpu_compile  # noqa: E402  (before JAX starts)

PRESETS = {
    "cross_tpu": ("dualcse", "dualcse_jax.configs.cross_tpu"),
    "bi_tpu": ("dualcse", "dualcse_jax.configs.bi_tpu"),
    "simcse_tpu": ("dualcse", "dualcse_jax.configs.simcse_tpu"),
    "dual_tpu": ("docent", "docent_jax.configs.dual_tpu"),
    "full_tpu": ("docent", "docent_jax.configs.full_tpu"),
    "hybrid_tpu": ("docent", "docent_jax.configs.hybrid_tpu"),
    "convrr_tpu": ("mrwe", "mrwe_jax.configs.convrr_tpu"),
    "fcrr_tpu": ("mrwe", "mrwe_jax.configs.fcrr_tpu"),
    "mnrl_tpu": ("sentence", "sentence_jax.configs.mnrl_tpu"),
}
SLICES = {  # (smaller, the presets' own, larger)
    "v4": ("v4:2x2x2", "v4:2x2x4", "v4:2x4x4"),
    "v5e": ("v5e:4x8", "v5e:8x8", "v5e:8x16"),
    "v5p": ("v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4"),
    "v6e": ("v6e:4x8", "v6e:8x8", "v6e:8x16"),
}
"""The presets are sized for 16 chips of v4 / v5p and 64 of v5e / v6e (their docstrings)."""
ENCODE_BATCH_PER_CHIP = 256
RANKING_QUERIES_PER_CHIP = 64
_CODE = ""
FIT = 0.9  # --largest: a batch fits when it needs at most this share of the chip's HBM


def _config(module: str, tiny: bool):
    import importlib

    config = importlib.import_module(module).get_config()
    if tiny:
        config["max_seq_length" if "max_seq_length" in config else "max_length"] = 16
    return config


def _fit_chunk(config, mesh) -> str:
    """The preset's GradCache / loss chunk, lowered to divide the per-device batch of a
    large slice; returns a note when it changed."""
    per_device = int(config.batch_size) // mesh.shape["data"]
    notes = []
    for field in ("contrastive_chunk_size", "loss_chunk_size"):
        chunk = int(config.get(field, 0) or 0)
        if chunk and per_device % chunk:
            new = max(d for d in range(1, chunk + 1) if per_device % d == 0)
            config[field] = new
            notes.append(f"{field} {chunk} -> {new}")
    return "; ".join(notes)


def build(preset: str, slice_name: str, *, tiny: bool, batch: int | None = None,
          layers: int | None = None):
    """``(compiled, examples, mesh, chip, note)`` of one case; ``layers`` overrides the
    encoder's depth (``--slope-layers``)."""
    import tpu_cases

    devices, chip = tpu_compile.topology(slice_name)
    shape = tpu_cases.TINY_BERT if tiny else tpu_cases.BERT_BASE
    encoder = tpu_cases.encoder_config({**shape, **({"num_hidden_layers": layers}
                                                     if layers else {})})
    if preset == "encode":
        mesh = tpu_compile.mesh_of(devices)
        per = ENCODE_BATCH_PER_CHIP * (mesh.size // chip.cores)
        return (*tpu_cases.encode_batch(encoder, mesh, per, 16 if tiny else 128), mesh, chip,
                f"{ENCODE_BATCH_PER_CHIP} texts x 128 tokens per chip, float32")
    if preset == "ranking":
        mesh = tpu_compile.mesh_of(devices, model=chip.cores * 2)
        queries = RANKING_QUERIES_PER_CHIP * (mesh.size // chip.cores)
        dim = encoder.hidden_size
        return (*tpu_cases.ranking_block(mesh, queries, dim=dim), mesh, chip,
                f"{RANKING_QUERIES_PER_CHIP} queries per chip, top 100 of 81,057 entities")
    package, module = PRESETS[preset]
    config = _config(module, tiny)
    if batch:
        config.batch_size = batch
    mesh = tpu_compile.mesh_of(devices, model=int(config.get("mesh_model", 1) or 1))
    if package == "mrwe":
        per = int(config.contextual_batch_size)
        return (*tpu_cases.mrwe_features(encoder, mesh, per * (mesh.size // chip.cores),
                                         16 if tiny else 128), mesh, chip,
                f"{per} windows x 128 tokens per chip (the train step is the small tower)")
    note = _fit_chunk(config, mesh)
    step = {"dualcse": tpu_cases.dualcse_step, "docent": tpu_cases.docent_step,
            "sentence": tpu_cases.sentence_step}[package]
    return (*step(config, encoder, mesh), mesh, chip, note)


def _code_hash() -> str:
    """The Python sources a case is built from (the five packages, these benchmarks)."""
    root = tpu_compile.ROOT
    digest = hashlib.sha256()
    for path in sorted([*root.glob("benchmarks/tpu_*.py"),
                        *(p for pkg in CODE for p in (root / pkg).rglob("*.py"))]):
        digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


CODE = ("embedding_core", "data_pipelines", "dualcse_jax", "docent_jax", "mrwe_jax",
        "sentence_jax")


def fingerprint(preset: str, slice_name: str, tiny: bool, batch: int | None,
                layers: int | None = None) -> str:
    """What a kept result depends on: config, slice, jax and libtpu versions, the code."""
    config = "" if preset in ("encode", "ranking") else \
        _config(PRESETS[preset][1], tiny).to_json(sort_keys=True)
    text = json.dumps([preset, slice_name, tiny, batch, config, jax.__version__,
                       tpu_compile.libtpu_version(), _CODE] + ([layers] if layers else []))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_case(name: str, preset: str, slice_name: str, kept: dict, *, tiny: bool,
             batch: int | None = None, layers: int | None = None) -> dict:
    key = fingerprint(preset, slice_name, tiny, batch, layers)
    if kept.get(name, {}).get("fingerprint") == key and "error" not in kept[name]:
        print(f"{name}: kept from an earlier run with the same inputs", flush=True)
        return kept[name]
    started = time.perf_counter()
    try:
        compiled, examples, mesh, chip, note = build(preset, slice_name, tiny=tiny, batch=batch,
                                                     layers=layers)
        out = tpu_compile.analyse(compiled, mesh, chip, examples)
    except Exception as e:  # a case libtpu refuses is a finding, not the end of the plan
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        print(f"{name}: FAILED {out['error']}", flush=True)
        return {**out, "fingerprint": key}
    out.update(note=note, examples_per_step=examples, fingerprint=key,
               compile_s=round(time.perf_counter() - started, 1))
    print(line(name, out), flush=True)
    return out


def line(name: str, r: dict) -> str:
    """One case as a printed row."""
    if "error" in r:
        return f"{name}: FAILED {r['error']}"
    coll = ", ".join(f"{c['kind']}[{c['axis']}] {c['bytes'] / 2**20:.1f} MiB"
                     for c in r["collectives"][:4]) or "none"
    return (f"{name:34s} {r['device_kind']:12s} {r['chips']:4d} chips  HBM "
            f"{r['hbm_bytes'] / 2**30:6.2f} / {r['hbm_capacity_bytes'] / 2**30:5.2f} GiB "
            f"{'fits' if r['fits'] else 'DOES NOT FIT'}  {r['flops'] / 1e12:8.2f} TFLOP "
            f"{r['step_time_bound_s'] * 1e3:8.2f} ms ({r['bound_by']}) "
            f"MFU<={r['mfu_bound']:.2f} {r['examples_per_s_per_chip']:8.1f} ex/s/chip | "
            f"{coll}" + (f" | {r['note']}" if r.get("note") else ""))


_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")


def _need(r: dict, base: dict, cores: int) -> float | None:
    """Per-chip HBM of a compiled case, or, for one the TPU compiler refused for memory,
    the temporaries its message names plus the base case's arguments (bytes)."""
    if "error" not in r:
        return float(r["hbm_bytes"])
    m = _OOM.search(r["error"])
    if not m:
        return None
    return float(m[1]) * 1024 ** " KMGT".index(m[2]) * cores + base["arg_bytes"]


def largest_batch(preset: str, slice_name: str, kept: dict, results: dict, *, tiny: bool,
                  save, layers: int | None = None, probe: int = 64, tries: int = 3) -> dict:
    """The largest global batch (a multiple of data size x chunk) that compiles within
    ``FIT`` of HBM, the preset's chunks kept. HBM is taken as affine in the batch between
    the preset's batch and ``probe`` times it (an out-of-memory refusal still names the
    temporaries it needs); the predicted batch is compiled and moved by the measured
    ratio until it fits (at most ``tries`` compiles). With GradCache chunks HBM grows
    only with the gathered embeddings, so the answer is far above the preset's batch.

    ``layers``: search on an encoder that deep, every figure raised by the full model's
    excess at the preset's batch (the named case, kept from an earlier run where there
    is one). Under GradCache chunks what grows with the batch (stored embeddings and their
    gradients, gathered keys, score rows, the batch) does not depend on depth."""
    _, module = PRESETS[preset]
    config = _config(module, tiny)
    base = int(config.batch_size)
    devices, chip = tpu_compile.topology(slice_name)
    cap = FIT * chip.hbm_bytes
    unit = len(devices) * max(int(config.get("contrastive_chunk_size", 0) or 1), 1)
    suffix = f"#layers={layers}" if layers else ""
    named = f"{preset}@{slice_name}"

    def compiled(batch: int) -> dict:
        name = f"{named}#batch={batch}{suffix}"
        results[name] = run_case(name, preset, slice_name, kept, tiny=tiny, batch=batch,
                                 layers=layers)
        save()
        return results[name]

    full = results.get(named) or (kept.get(named) if layers else None)
    if not full or "error" in full:
        full = results[named] = run_case(named, preset, slice_name, kept, tiny=tiny)
        save()
    if "error" in full:
        return {"error": full["error"]}
    first = compiled(base) if layers else full
    if "error" in first:
        return {"error": first["error"]}
    offset = full["hbm_bytes"] - first["hbm_bytes"]

    def need(r: dict) -> float | None:
        n = _need(r, first, chip.cores)
        return None if n is None else n + offset

    far = max(unit, base * probe // unit * unit)
    at_far = need(compiled(far))
    if at_far is None:
        return {"error": f"batch {far}: {results[f'{named}#batch={far}{suffix}']['error']}"}
    slope = (at_far - full["hbm_bytes"]) / (far - base)
    batch = far if slope <= 0 else int((cap - full["hbm_bytes"]) / slope + base)
    best = base if full["hbm_bytes"] <= cap else None
    for _ in range(tries):
        batch = max(unit, batch // unit * unit)
        r = compiled(batch)
        n = need(r)
        if n is not None and "error" not in r and n <= cap:
            best = max(best or 0, batch)
            if n > 0.93 * cap:  # within 7%: another compile is not worth it
                break
        elif n is None:
            break
        # affine from the base case through this one, aimed at the cap
        slope = (n - full["hbm_bytes"]) / (batch - base) if batch != base else 0
        nxt = int((0.97 * cap - full["hbm_bytes"]) / slope + base) if slope > 0 else 2 * batch
        if nxt // unit * unit == batch:
            break
        batch = nxt
    if best is None:
        return {"largest_batch": None, "note": f"no batch within {FIT:.0%} of HBM"}
    out = {"largest_batch": best}
    if best != base:
        r = results[f"{named}#batch={best}{suffix}"]
        out.update(hbm_bytes=int(r["hbm_bytes"] + offset),
                   step_time_bound_s=r["step_time_bound_s"] if not layers else None)
    if layers:
        out["note"] = (f"searched on a {layers}-layer encoder, HBM + {offset / 2**30:.2f} "
                       f"GiB (the full model's excess at batch {base}, case fingerprint "
                       f"{full.get('fingerprint')})")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="all",
                        help=f"comma-separated, of {list(PRESETS)} + encode, ranking")
    parser.add_argument("--generations", default="all", help=f"of {list(SLICES)}")
    parser.add_argument("--sizes", default="named", choices=("named", "all"),
                        help="named: the slices the presets are sized for; all: also one "
                             "smaller and one larger")
    parser.add_argument("--largest", action="store_true",
                        help="search the largest global batch per preset and generation")
    parser.add_argument("--slope-layers", type=int, default=None,
                        help="--largest searched on an encoder this deep (minutes, not hours), "
                             "every figure raised by the full model's excess at the preset's "
                             "batch (its named case, kept from an earlier run if there is one)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' tiny BERT at 16 tokens (minutes, not hours)")
    parser.add_argument("--results", default=None,
                        help="JSON kept as cases finish; unchanged cases are reused "
                             "(default benchmarks/results/tpu_plan[_tiny].json)")
    args = parser.parse_args(argv)
    global _CODE
    _CODE = _code_hash()
    why = tpu_compile.unavailable()
    if why:
        parser.exit(2, f"tpu_plan: {why}\n")
    wanted = list(PRESETS) + ["encode", "ranking"] if args.presets == "all" else \
        [p for p in args.presets.split(",") if p]
    gens = list(SLICES) if args.generations == "all" else args.generations.split(",")
    bad = [p for p in wanted if p not in PRESETS and p not in ("encode", "ranking")] + \
        [g for g in gens if g not in SLICES]
    if bad:
        parser.error(f"unknown preset(s) or generation(s) {bad}")
    path = Path(args.results or Path(__file__).parent / "results" /
                f"tpu_plan{'_tiny' if args.tiny else ''}.json")
    kept = json.loads(path.read_text()) if path.is_file() else {}
    results: dict = {}

    def save():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**kept, **results}, indent=1, sort_keys=True))
        tmp.replace(path)

    print(f"jax {jax.__version__}, libtpu {tpu_compile.libtpu_version()}; compiling on "
          "this CPU for TPU slices (BERT-base: minutes per case on 2 cores)", flush=True)
    for gen in gens:
        slices = SLICES[gen] if args.sizes == "all" else SLICES[gen][1:2]
        for slice_name in slices:
            for preset in wanted:
                name = f"{preset}@{slice_name}"
                if args.slope_layers and name in kept:
                    continue  # largest_batch takes the kept case as it stands
                results[name] = run_case(name, preset, slice_name, kept, tiny=args.tiny)
                save()
        if args.largest:
            for preset in (p for p in wanted if PRESETS.get(p, ("",))[0] in ("dualcse",
                                                                           "docent")):
                name = f"{preset}@{SLICES[gen][1]}#largest"
                results[name] = largest_batch(preset, SLICES[gen][1], kept, results,
                                              tiny=args.tiny, save=save,
                                              layers=args.slope_layers)
                print(f"{name}: {results[name]}", flush=True)
                save()
    summary = {k: {f: v.get(f) for f in ("device_kind", "chips", "hbm_bytes",
                                         "hbm_capacity_bytes", "fits", "flops",
                                         "collective_bytes", "step_time_bound_s",
                                         "mfu_bound", "examples_per_s_per_chip",
                                         "largest_batch", "error") if f in v}
               for k, v in results.items()}
    print(json.dumps(summary))
    return results


if __name__ == "__main__":
    main()
