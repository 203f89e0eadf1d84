"""What every command-line tool of the project does before ``app.run``."""

from __future__ import annotations

import contextlib
import logging as pylogging
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence

from absl import app, flags, logging

from embedding_core import storage

_NOISY = ("orbax", "xla_bridge", "jax/_src", "gcsfs")


def enable_compilation_cache() -> None:
    """JAX's persistent compile cache: a second run skips most of its warm-up.

    Location: ``$JAX_COMPILATION_CACHE_DIR`` when set (JAX's own setting), else
    ``$EMBEDDING_JAX_CACHE/jax_compile`` (default ``~/.cache/embedding_jax``). The cache
    stays local even for a ``gs://`` workdir.
    """
    import jax

    from data_pipelines.paths import cache_dir

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax_compile"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quiet_library_logs() -> None:
    """INFO lines from this project (metrics, progress); only warnings from orbax/XLA/gcsfs;
    gcsfs's retry messages without their tracebacks."""
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(
        lambda record: record.levelno >= pylogging.WARNING
        or not any(n in record.pathname for n in _NOISY))
    logging.get_absl_handler().addFilter(_drop_storage_traceback)


def _drop_storage_traceback(record: pylogging.LogRecord) -> bool:
    # gcsfs logs every retried request with its whole traceback; the message line says
    # what failed, and a request out of retries reaches the user as one line anyway.
    if record.name.startswith("gcsfs"):
        record.exc_info, record.exc_text = None, None
    return True


def run_app(main: Callable[[list[str]], None], module: types.ModuleType) -> None:
    """Runs an absl ``main`` with the project's defaults.

    ``--help`` prints ``module``'s docstring and its flags, the shared ones included
    (console scripts run a generated ``__main__``, so both are adopted from the CLI module).
    """
    from embedding_core.run_control import EXIT_CODES_HELP

    # Every CLI's help ends with the config command and the exit codes of train, written
    # once in the core.
    prog = os.path.basename(sys.argv[0])
    for text in (CONFIG_COMMAND_HELP.replace("PROG", prog), EXIT_CODES_HELP):
        if module.__doc__ and text not in module.__doc__:
            module.__doc__ += text
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module is not module:
        main_module.__doc__ = module.__doc__
    # absl lists the key flags of the module named sys.argv[0]: the CLI module's own flags
    # and the shared ones defined here.
    for name in {module.__name__, __name__, sys.argv[0]}:
        for flag in flags.FLAGS.get_key_flags_for_module(name):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    enable_compilation_cache()
    quiet_library_logs()
    app.run(main, flags_parser=_parse_flags)


def define_workdir_flags(default_config: str, workdir_help: str = (
        "Training directory (checkpoints, config, eval).")) -> None:
    """The flags every model's CLI shares: ``--config`` (an ml_collections file, fields
    overridable as ``--config.FIELD=VALUE``), ``--workdir``, ``--step`` and
    ``--num_train_steps`` (the demo's override)."""
    from ml_collections import config_flags

    try:
        # ml_collections defines one flag per --config.FIELD found in sys.argv, here.
        config_flags.DEFINE_config_file("config", default_config, "Training configuration "
                                        "file (a Python file with get_config()).",
                                        lock_config=True)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        _bad_override(sys.argv, err)
    flags.DEFINE_string("workdir", None, workdir_help)
    flags.DEFINE_integer("step", None, "evaluate/export: checkpoint step (default: latest).")
    flags.DEFINE_integer("num_train_steps", None, "demo: override the preset's step count.")


CONFIG_COMMAND = "config"
CONFIG_COMMAND_HELP = """
config    lists every field of --config (default: the package's configs/default.py) as
          `field = value  # comment`, with any --config.FIELD=VALUE applied; no --workdir.
          Example: PROG config --config=PRESET.py --config.batch_size=32
"""
"""The ``config`` command every CLI answers in :func:`parse_command`."""


# Commands that load a trained model and may run on several processes (each process
# encodes its slice, process 0 writes: embedding_core.multihost).
SHARED_WORK_COMMANDS = ("evaluate", "export")


NO_WORKDIR_COMMANDS = ("preprocess",)
"""Commands that write no run (``embedding_core.preprocess``): ``--workdir`` not needed."""


def parse_command(argv: Sequence[str], commands: Sequence[str]) -> str:
    """The one positional command of ``argv``; ``--workdir`` must be set (except for
    :data:`NO_WORKDIR_COMMANDS`).

    For ``evaluate`` and ``export`` this also starts ``jax.distributed`` when asked, from
    the same fields as ``train``: ``--config.coordinator_address`` (``auto`` on a TPU
    pod), ``--config.num_processes``, ``--config.process_id``, or the
    ``JAX_COORDINATOR_ADDRESS`` environment variable (``docs/architecture.md``).

    ``config`` (:data:`CONFIG_COMMAND_HELP`) is answered here for every tool: the fields
    are printed and the process exits with status 0.

    Exits with status 1 and a two-line usage message on no command, an unknown one,
    several, or no ``--workdir``.
    """
    prog = os.path.basename(sys.argv[0])
    if argv[1:] == [CONFIG_COMMAND]:
        print_config()
        sys.exit(0)
    if len(argv) != 2 or argv[1] not in commands:
        got = f" (got {argv[1:]})" if len(argv) > 1 else ""
        sys.exit(f"usage: {prog} {{{'|'.join(commands)}}} --workdir=DIR [flags]{got}\n"
                 f"{prog} --help explains the commands and flags; {prog} {CONFIG_COMMAND} "
                 "lists the config fields")
    if not flags.FLAGS.workdir and argv[1] not in NO_WORKDIR_COMMANDS:
        sys.exit(f"{prog} {argv[1]}: error: --workdir is required (see --help)")
    if argv[1] in SHARED_WORK_COMMANDS:
        from embedding_core import parallel

        config = flags.FLAGS.config
        # Before anything touches a device: jax.distributed must start first.
        parallel.maybe_initialize_distributed(
            config.get("coordinator_address") or None, config.get("num_processes") or None,
            config.process_id if config.get("process_id", -1) >= 0 else None)
    return argv[1]


def print_config() -> None:
    """Prints the parsed ``--config`` field by field with the comments of its source
    (``embedding_core.config_help.describe``)."""
    from ml_collections import config_flags

    from embedding_core.config_help import describe

    print(describe(flags.FLAGS.config, config_flags.get_config_filename(flags.FLAGS["config"])))


DEBUG_ENV = "EMBEDDING_JAX_DEBUG"


@contextlib.contextmanager
def user_errors(prog: str, command: str) -> Iterator[None]:
    """Bad paths, bad data and bad settings are the user's to fix: exit with status 1 and
    the message (which names file, line and field), not a traceback.

    ``OSError`` (missing file, a folder where a file belongs, ...) and ``ValueError`` (which
    ``DataError`` and every config check raise) are reported this way; with
    ``EMBEDDING_JAX_DEBUG=1`` they propagate with their traceback. How a run stopped is
    one line with its exit code (``embedding_core.run_control``): a diverged run or a
    workdir in use 1, SIGTERM 75 (resume me), Ctrl-C 130 (a second one too, naming the
    latest complete checkpoint).
    """
    from embedding_core import run_control

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
    except (OSError, ValueError) as err:
        if os.environ.get(DEBUG_ENV):
            raise
        sys.exit(f"{prog} {command}: error: {err}\n({DEBUG_ENV}=1 shows the traceback)")


def _parse_flags(argv: list[str]) -> list[str]:
    # absl reports unknown flags itself, but a bad --config file or --config.FIELD override
    # surfaces as a chain of ml_collections tracebacks: check and word them here.
    argv = list(argv)
    for i, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
            if storage.is_remote(value):
                argv[i] = arg = f"--config={_local_config(value)}"
            path = arg.split("=", 1)[1].split(":", 1)[0]
            if not os.path.isfile(path):
                sys.exit(f"error: --config={path}: no such file (give a Python file with "
                         "get_config(), e.g. dualcse_jax/configs/cross_cpu.py)")
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
        _bad_override(argv, err)


def _local_config(value: str) -> str:
    # ml_collections imports the config file as a Python module, which needs a local file:
    # a gs:// one is copied into the cache (":ARG" after the file name is kept).
    head, sep, extra = value[len("gs://"):].partition(":")
    try:
        local = storage.local_copy("gs://" + head)
    except (OSError, ValueError) as err:
        sys.exit(f"error: --config={value}: {err}")
    return f"{local}{sep}{extra}"


def _bad_override(argv: Sequence[str], err: Exception) -> None:
    overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    reason = str(err)
    if isinstance(err, (AttributeError, KeyError)):
        # ml_collections nests reprs: "'\\'name\\'\\nDid you mean ...'"; unwrap them.
        text = reason.replace("\\n", "\n").replace("\\", "")
        name, _, hint = text.partition("\n")
        reason = f"the config has no field {name.strip(chr(34) + chr(39))!r}"
        if hint.strip(chr(34) + chr(39) + " "):
            reason += f" ({hint.strip(chr(34) + chr(39) + ' ')})"
    sys.exit(f"error: bad --config override among {overrides}: {reason}; the fields are "
             "those of the config file (see it): --config.FIELD=VALUE needs an existing FIELD "
             "and a VALUE of its type")
