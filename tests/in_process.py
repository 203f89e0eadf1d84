"""A package's command line run in this process (the in-process tier's stand-in for
``subprocess.run([python, "-m", MODULE, ...])``): ``run_cli("dualcse_jax.main", "train",
...)`` returns the exit status and what the command printed."""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import runpy
import sys
from dataclasses import dataclass

from absl import flags

# Modules whose absl flags a command line defines; removed for the run, restored after.
PROJECT = ("embedding_core", "dualcse_jax", "docent_jax", "mrwe_jax", "sentence_jax",
           "data_pipelines", "experiments", "tests")


@dataclass
class Done:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would return."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _fresh_flags():
    """absl's global flags without the project's for the block; every flag defined in the
    block is dropped and the earlier ones come back after (the CLI modules define theirs
    on import, and two packages define the same names)."""
    from absl import app

    app.define_help_flags()  # absl defines them on its first run: kept past the block
    state = flags.FLAGS.__dict__
    saved = {k: copy.copy(v) for k, v in state.items()}
    saved.update({k: {m: list(f) for m, f in v.items()} for k, v in state.items()
                  if k.endswith("by_module") or k.endswith("by_module_id")})
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith(PROJECT):
            for flag in list(defined):
                if flag.name in flags.FLAGS:
                    delattr(flags.FLAGS, flag.name)
    try:
        yield
    finally:
        state.clear()
        state.update(saved)


def _restore_module(module: str, saved: object) -> None:
    """Puts back ``module`` as it was before the run, in ``sys.modules`` and as its
    package's attribute (``from PACKAGE import main`` reads the attribute, which the import
    set to the run's module, whose flags are gone)."""
    if saved is not None:
        sys.modules[module] = saved
    parent, _, name = module.rpartition(".")
    if parent and (package := sys.modules.get(parent)) is not None:
        if saved is not None:
            setattr(package, name, saved)
        elif hasattr(package, name):
            delattr(package, name)


def run_cli(module: str, *args, env: dict[str, str] | None = None) -> Done:
    """Runs ``python -m MODULE ARGS`` here: ``MODULE.run()`` with ``sys.argv`` set, the
    module imported afresh (its flags read ``sys.argv`` when defined), its ``__main__``
    block for a module without ``run``, or ``python MODULE ARGS`` for a ``.py`` path;
    ``SystemExit`` is the exit status, a string one printed to stderr as Python would."""
    import jax
    import pytest
    from absl import logging

    argv = [module, *(str(a) for a in args)]
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_main = sys.argv, sys.modules.pop(module, None)
    handler, verbosity = logging.get_absl_handler().python_handler, logging.get_verbosity()
    code: object = 0
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        # The CLI's compile cache is this process's (it would switch to its own).
        patch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir or "")
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        patch.setattr(handler, "stream", err)  # log lines go where the subprocess's would
        stack.callback(logging.set_verbosity, verbosity)
        stack.enter_context(_fresh_flags())
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        sys.argv = argv
        try:
            if module.endswith(".py"):  # a script: what `python SCRIPT` runs
                runpy.run_path(module, run_name="__main__")
            elif hasattr(main := importlib.import_module(module), "run"):
                main.run()
            else:  # its `if __name__ == "__main__":` block, as `python -m` runs it
                sys.modules.pop(module)  # runpy warns of a module imported before it runs
                runpy.run_module(module, run_name="__main__")
        except SystemExit as done:
            code = done.code
        finally:
            sys.argv = saved_argv
            sys.modules.pop(module, None)
            _restore_module(module, saved_main)
    if isinstance(code, str):
        err.write(code + "\n")
        code = 1
    return Done(int(code or 0), out.getvalue(), err.getvalue())


def run_subprocess(module: str, *args, env: dict[str, str] | None = None) -> Done:
    """``python -m MODULE ARGS`` (``python MODULE ARGS`` for a ``.py`` path) in a child
    process with this one's compile cache (the slow tier's form of :func:`run_cli`)."""
    import os
    import subprocess
    from pathlib import Path

    import jax

    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir
           or "", **(env or {})}
    # A hang guard only: the command ends by itself (the test waits for its exit).
    command = [module] if module.endswith(".py") else ["-m", module]
    done = subprocess.run([sys.executable, *command, *(str(a) for a in args)],
                          capture_output=True, text=True, timeout=1800, env=env,
                          cwd=Path(__file__).parents[1])
    return Done(done.returncode, done.stdout, done.stderr)
