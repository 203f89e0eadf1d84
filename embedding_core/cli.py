"""What every command-line tool of the project does before ``app.run``."""

from __future__ import annotations

import contextlib
import logging as pylogging
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence

from absl import app, flags, logging

from embedding_core.errors import DataError, StorageError
from embedding_core.storage import storage

_NOISY = ("orbax", "xla_bridge", "jax/_src", "gcsfs")


def enable_compilation_cache() -> None:
    """JAX's persistent compile cache in ``$JAX_COMPILATION_CACHE_DIR``, else
    ``$EMBEDDING_JAX_CACHE/jax_compile`` (local even for a ``gs://`` workdir)."""
    import jax

    from embedding_core.storage.storage import cache_dir

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax_compile"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quiet_library_logs() -> None:
    """This project's INFO lines; warnings only from orbax/XLA/gcsfs, without gcsfs's retry
    tracebacks or (without ``EMBEDDING_JAX_DEBUG``) orbax's of a failed write."""
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(
        lambda record: record.levelno >= pylogging.WARNING
        or not any(n in record.pathname for n in _NOISY))
    logging.get_absl_handler().addFilter(_drop_storage_traceback)
    if not os.environ.get(DEBUG_ENV):
        logging.get_absl_handler().addFilter(_drop_reraised_write_errors)
        _quiet_closed_loop_callbacks()
    logging.get_absl_handler().addFilter(_ReadaheadSummary())


def _drop_storage_traceback(record: pylogging.LogRecord) -> bool:
    # gcsfs logs every retried request with its traceback; the message line says enough.
    if record.name.startswith("gcsfs"):
        record.exc_info, record.exc_text = None, None
    return True


# orbax logs a failed async write in each thread it passes through, then raises it.
_WRITE_THREADS = ("future.py", "async_checkpointer.py", "checkpoint_manager.py")


def _drop_reraised_write_errors(record: pylogging.LogRecord) -> bool:
    return not (record.exc_info and record.levelno >= pylogging.ERROR
                and "orbax" in record.pathname
                and os.path.basename(record.pathname) in _WRITE_THREADS)


class _ReadaheadSummary(pylogging.Filter):
    """fsspec's readahead-cache line of every gs:// file it opens, once."""

    seen = False

    def filter(self, record: pylogging.LogRecord) -> bool:
        if not (record.name.startswith("fsspec")
                and str(record.msg).startswith("AdaptiveReadaheadCache")):
            return True
        if self.seen:
            return False
        self.seen = True
        record.msg, record.args = ("%s (for each gs:// file read; logged once)",
                                   (record.getMessage(),))
        return True


def _quiet_closed_loop_callbacks() -> None:
    # After a failed write tensorstore prints "Event loop is closed" from its threads.
    import threading

    def quiet(value: BaseException | None) -> bool:
        return (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
                and threading.current_thread() is not threading.main_thread())

    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook
    sys.excepthook = lambda kind, value, tb: None if quiet(value) else excepthook(
        kind, value, tb)
    sys.unraisablehook = lambda info: None if quiet(info.exc_value) else unraisablehook(info)


def run_app(main: Callable[[list[str]], None], module: types.ModuleType) -> None:
    """Runs an absl ``main`` with the project's defaults; ``--help`` prints ``module``'s
    docstring and flags, the shared ones included."""
    from embedding_core.training.run_control import EXIT_CODES_HELP

    # Every CLI's help ends with the exit codes of train, written once in the core.
    if module.__doc__ and EXIT_CODES_HELP not in module.__doc__:
        module.__doc__ += EXIT_CODES_HELP
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module is not module:
        main_module.__doc__ = module.__doc__
    # absl lists the key flags of the module named sys.argv[0].
    for name in {module.__name__, __name__, "embedding_core.commands", sys.argv[0]}:
        for flag in flags.FLAGS.get_key_flags_for_module(name):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    enable_compilation_cache()
    quiet_library_logs()
    app.run(main, flags_parser=_parse_flags)


DEBUG_ENV = "EMBEDDING_JAX_DEBUG"


@contextlib.contextmanager
def user_errors(prog: str, command: str) -> Iterator[None]:
    """``OSError``, ``ValueError`` and stopped runs as one line and an exit code (1; SIGTERM
    75, Ctrl-C 130), not a traceback (``EMBEDDING_JAX_DEBUG=1``: with it)."""
    from embedding_core.training import run_control

    try:
        yield
    except (run_control.Preempted, run_control.Interrupted, run_control.Aborted) as stop:
        print(f"{prog} {command}: {stop}", file=sys.stderr)
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        print(f"{prog} {command}: interrupted (Ctrl-C); nothing saved", file=sys.stderr)
        sys.exit(run_control.EXIT_INTERRUPTED)
    except (run_control.DivergedError, run_control.WorkdirInUseError) as err:
        sys.exit(f"{prog} {command}: error: {err}")
    except (StorageError, DataError, FileNotFoundError) as err:  # the whole report: no hint
        if os.environ.get(DEBUG_ENV):
            raise
        sys.exit(f"{prog} {command}: error: {storage.describe_error(err)}")
    except (OSError, ValueError) as err:
        if os.environ.get(DEBUG_ENV):
            raise
        sys.exit(f"{prog} {command}: error: {storage.describe_error(err)}\n({DEBUG_ENV}=1 "
                 "shows the traceback)")


PRESETS_DIR: list[str] = []  # the running package's configs folder (commands.define_flags)


def preset_names() -> list[str]:
    """The presets of the running package, by name."""
    if not PRESETS_DIR:
        return []
    return sorted(n[:-3] for n in os.listdir(PRESETS_DIR[0])
                  if n.endswith(".py") and not n.startswith("_"))


def find_preset(name: str) -> str | None:
    """The file of a preset named ``NAME``, ``NAME.py`` or ``PACKAGE.configs.NAME`` (an
    installed wheel has no clone to give a path into), else None."""
    import importlib.util

    if "." in name and not name.endswith(".py") and "/" not in name:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        return spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None
    stem = name[:-3] if name.endswith(".py") else name
    return os.path.join(PRESETS_DIR[0], f"{stem}.py") if stem in preset_names() else None


def _parse_flags(argv: list[str]) -> list[str]:
    # A bad --config file or override would surface as ml_collections tracebacks.
    argv = list(argv)
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
            if storage.is_remote(value):
                argv[i] = arg = f"--config={_local_config(value)}"
            path, sep, extra = arg.split("=", 1)[1].partition(":")
            if not os.path.isfile(path):
                preset = find_preset(path)
                if preset is None:
                    sys.exit(f"error: --config={path}: no such file or preset (give a Python "
                             "file with get_config(), or a preset by name: "
                             f"{', '.join(preset_names()) or 'none'})")
                argv[i] = f"--config={preset}{sep}{extra}"
    try:
        return flags.FLAGS(argv)
    except SystemExit as done:
        # absl's --help exits 1 after printing the help; asking for help is not a failure.
        if any(a in ("--help", "-h", "--helpfull", "-?") for a in argv[1:]):
            sys.exit(0)
        raise done
    except flags.Error as err:
        sys.exit(f"error: {err}\nPass --help for usage.")
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        bad_override(argv, err)


def _local_config(value: str) -> str:
    # ml_collections imports the config file: a gs:// one is copied (":ARG" kept).
    head, sep, extra = value[len("gs://"):].partition(":")
    try:
        local = storage.local_copy("gs://" + head)
    except (OSError, ValueError) as err:
        sys.exit(f"error: --config={value}: {err}")
    return f"{local}{sep}{extra}"


def bad_override(argv: Sequence[str], err: Exception) -> None:
    """Exits with one line for a bad ``--config.FIELD=VALUE`` (as ``Fields.check``'s)."""
    from embedding_core.fields import unknown_field_message

    overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    if isinstance(err, (AttributeError, KeyError)):
        # ml_collections nests reprs: "'\\'name\\'\\nDid you mean ...'"; unwrap them.
        name = str(err).replace("\\n", "\n").replace("\\", "").partition("\n")[0]
        name = name.strip(chr(34) + chr(39) + " ")
        # Before the config is parsed, ml_collections' own suggestion is all there is.
        known = re.findall(r'Did you mean "([^"]+)"', str(err).replace("\\", ""))
        try:
            known = list(flags.FLAGS["config"].value.keys())
        except Exception:  # the config file itself failed: no fields to suggest from
            pass
        sys.exit(f"error: {unknown_field_message(name, known)}")
    sys.exit(f"error: bad --config override among {overrides}: {err}; --config.FIELD=VALUE "
             "needs an existing FIELD and a VALUE of its type")
