"""What every command-line tool of the project does before ``app.run``."""

from __future__ import annotations

import logging as pylogging
import os
import sys
import types
from collections.abc import Callable

from absl import app, flags, logging

_NOISY = ("orbax", "xla_bridge", "jax/_src")


def enable_compilation_cache() -> None:
    """JAX's persistent compile cache: a second run skips most of its warm-up.

    Location: ``$EMBEDDING_JAX_CACHE/jax_compile`` (default ``~/.cache/embedding_jax``).
    """
    import jax

    from data_pipelines.paths import cache_dir

    jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax_compile"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quiet_library_logs() -> None:
    """INFO lines from this project (metrics, progress); only warnings from orbax/XLA."""
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(
        lambda record: record.levelno >= pylogging.WARNING
        or not any(n in record.pathname for n in _NOISY))


def run_app(main: Callable[[list[str]], None], module: types.ModuleType) -> None:
    """Runs an absl ``main`` with the project's defaults.

    ``--help`` prints ``module``'s docstring and the flags it defines (console scripts
    run a generated ``__main__``, so both are adopted from the CLI module).
    """
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module is not module:
        main_module.__doc__ = module.__doc__
        flags.adopt_module_key_flags(module)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    enable_compilation_cache()
    quiet_library_logs()
    app.run(main)
