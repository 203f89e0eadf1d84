"""The command table every package's CLI is made of: a package declares a :class:`Program`;
the commands, flags, ``--help`` and error handling are here once (``docs/architecture.md``,
"Commands")."""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from absl import flags

from embedding_core import cli
from embedding_core.evaluation import run as evaluation
from embedding_core.fields import Fields
from embedding_core.storage import storage

FLAGS = flags.FLAGS


@dataclasses.dataclass
class Invocation:
    """What a command function gets: the parsed command line."""

    prog: str
    command: str
    workdir: str | None
    step: int | None
    config: Any  # the --config ConfigDict, overrides applied
    overrides: dict[str, Any]  # --config.FIELD=VALUE given on this command line
    flags: Any  # absl FLAGS: a package's own flags


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: ``run(invocation)``; ``usage`` and ``help`` make ``--help``."""

    name: str
    run: Callable[[Invocation], Any]
    usage: str = "--workdir=DIR"
    help: str = ""
    needs_workdir: bool = True
    shared_work: bool = False  # may run on several processes: jax.distributed starts first


@dataclasses.dataclass(frozen=True)
class Program:
    """A package's CLI: ``load(invocation) -> Encoder``; ``data_files``: path fields made
    absolute at train; ``text_name``: what a line of export's ``--input`` is, in errors."""

    prog: str
    summary: str
    fields: Fields
    default_config: str
    train: Callable[[Any, str], Any]
    load: Callable[[Invocation], Any]
    evaluate: Callable[[Invocation], Any]
    demo: Callable[[Invocation], Any]
    data_files: Sequence[str] = ()
    help: dict[str, str] = dataclasses.field(default_factory=dict)
    usage: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: Sequence[Command] = ()
    text_name: str = "text"

    def commands(self) -> list[Command]:
        u, h = self.usage, self.help
        out = "--output=OUT_DIR"
        return [
            Command("train", self._train, u.get("train", "--config=CONFIG.py --workdir=DIR "
                                                "[--config.FIELD=VALUE ...]"),
                    h.get("train", "")),
            Command("evaluate", self._evaluate, u.get("evaluate", "--workdir=DIR")
                    + " [--ir=DIR|FILE] [--sts=FILE] [--pairs=FILE] [--triplets=FILE]",
                    h.get("evaluate", "") + EVALUATE_FILES_HELP, shared_work=True),
            Command("export", self._export, u.get("export", f"--workdir=DIR {out} "
                                                  "[--input=TEXTS.txt] [--normalize]"),
                    EXPORT_HELP + h.get("export", ""), shared_work=True),
            Command("export-hf", self._export_hf, u.get("export-hf", f"--workdir=DIR {out}"),
                    EXPORT_HF_HELP + h.get("export-hf", "")),
            Command("demo", self.demo, u.get("demo", "--workdir=DIR [--num_train_steps=N]"),
                    h.get("demo", "")),
            *self.extra,
            Command("config", self._config, "[--config=PRESET.py] [--config.FIELD=VALUE]",
                    CONFIG_HELP, needs_workdir=False),
        ]

    def _train(self, inv: Invocation) -> None:
        config = storage.absolute_data_paths(inv.config, self.data_files)
        storage.check_data_paths(config, self.data_files)
        self.train(config, inv.workdir)
        print(f"checkpoints and TensorBoard events in {inv.workdir}")

    def _evaluate(self, inv: Invocation) -> Any:
        if any(FLAGS[kind].value for kind in evaluation.KINDS):
            return evaluate_files(self.load, inv)
        return self.evaluate(inv)

    def _export(self, inv: Invocation) -> None:
        from embedding_core.serving import serving

        output = FLAGS.output or os.path.join(str(inv.workdir), "export")
        serving.export(lambda: self.load(inv), output, input_path=FLAGS.input,
                       normalize=FLAGS.normalize, workdir=inv.workdir,
                       text_name=self.text_name)

    def _export_hf(self, inv: Invocation) -> None:
        from embedding_core.serving import serving

        if not FLAGS.output:
            raise ValueError("export-hf needs --output=DIR (a new or empty folder)")
        serving.export_hf(lambda: self.load(inv), FLAGS.output, workdir=inv.workdir)

    def _config(self, inv: Invocation) -> None:
        from ml_collections import config_flags

        print(self.fields.describe(inv.config, config_flags.get_config_filename(FLAGS["config"])))

    def usage_text(self) -> str:
        lines = [f"{self.prog}: {self.summary}", "", "Usage:"]
        lines += [f"  {self.prog} {c.name} {c.usage}" for c in self.commands()]
        lines.append("")
        for c in self.commands():
            body = textwrap.fill(" ".join(c.help.split()), 88, initial_indent=" " * 10,
                                 subsequent_indent=" " * 10)
            lines.append(f"{c.name:<9} " + body[10:] if len(c.name) < 10 else f"{c.name}\n{body}")
        return "\n".join(lines) + "\n"


EVALUATE_FILES_HELP = (" With --ir / --sts / --pairs / --triplets (your own files; "
                       "--view=NAME for one view of a two-view model): only those "
                       "evaluators, sentence-transformers' metrics, written to --output "
                       "(default DIR/eval/evaluators.json).")
EXPORT_HELP = ("writes OUT_DIR (default DIR/export)/<view>/ per view of the model: "
               "embeddings.npy float32 [N, dim] (row i = line i of --input, or the model's "
               "own rows), ids.txt and meta.json, export.json last (docs/export.md); "
               "--normalize writes unit rows. ")
EXPORT_HF_HELP = ("writes the trained encoder as Hugging Face / sentence-transformers "
                  "folders into a new or empty OUT_DIR: SentenceTransformer(folder).encode "
                  "needs no JAX (docs/export.md). ")
CONFIG_HELP = ("lists every field of --config (default: the package's configs/default.py) "
               "as `field = value  # help`, with any --config.FIELD=VALUE applied; no "
               "--workdir.")


def define_flags(default_config: str) -> None:
    """The flags every CLI shares (``--config`` with ``--config.FIELD=VALUE``)."""
    from ml_collections import config_flags

    cli.PRESETS_DIR[:] = [os.path.dirname(os.path.abspath(default_config))]
    try:
        # ml_collections defines one flag per --config.FIELD found in sys.argv, here.
        config_flags.DEFINE_config_file("config", default_config, "Training configuration "
                                        "file (a Python file with get_config()).",
                                        lock_config=True)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        cli.bad_override(sys.argv, err)
    flags.DEFINE_string("workdir", None, "Training directory (checkpoints, config, eval).")
    flags.DEFINE_integer("step", None, "evaluate/export: checkpoint step (default: latest).")
    flags.DEFINE_integer("num_train_steps", None, "demo: override the preset's step count.")
    flags.DEFINE_string("input", None, "export: a text file, one text per line (UTF-8).")
    flags.DEFINE_string("output", None, "export (default WORKDIR/export), export-hf: the "
                        "output folder.")
    flags.DEFINE_bool("normalize", None, "export: unit-length rows (default: the model's).")
    for kind, what in evaluation.FLAG_HELP.items():
        flags.DEFINE_multi_string(kind, [], f"evaluate: {what} (may repeat); with any of "
                                  "--ir/--sts/--pairs/--triplets, evaluate runs only these "
                                  "(docs/evaluation.md)")
    flags.DEFINE_string("ir_split", "test", "evaluate --ir=BEIR_DIR: the qrels split")
    flags.DEFINE_string("view", None, "evaluate --ir/--sts/...: the view to score "
                        "(default: the model's own)")
    flags.DEFINE_integer("batch_size", evaluation.DEFAULT_BATCH_SIZE, "evaluate "
                         "--ir/--sts/...: texts per encoder call", lower_bound=1)


def evaluate_files(program_load: Callable[[Invocation], Any], inv: Invocation) -> dict:
    """``evaluate --ir/...`` on the workdir's model (``--output`` default
    ``WORKDIR/eval/evaluators.json``)."""
    from embedding_core.distributed import multihost

    specs = evaluation.parse({kind: FLAGS[kind].value for kind in evaluation.KINDS},
                             batch_size=FLAGS.batch_size, split=FLAGS.ir_split)
    return evaluation.run_specs(
        specs, lambda: program_load(inv), view=FLAGS.view,
        output=FLAGS.output or os.path.join(str(inv.workdir), "eval", "evaluators.json"),
        about=lambda model: (f"{model.name} (step {model.step})", {
            "workdir": storage.display(inv.workdir), "step": model.step}),
        primary=multihost.is_primary())


def overrides() -> dict[str, Any]:
    """The ``--config.FIELD=VALUE`` fields given on this command line, with their values."""
    given = {a[len("--config."):].split("=", 1)[0] for a in sys.argv if a.startswith("--config.")}
    return {k: FLAGS.config[k] for k in sorted(given) if k in FLAGS.config}


def _paths_given(given) -> list[str]:
    """The paths of a command line: the workdir first, the flags', the evaluation files',
    the config's text fields (comma-separated ones split)."""
    values = [given.workdir, given.output, given.input]
    values += [path for kind in evaluation.KINDS for path in given[kind].value]
    paths = [part.strip() for v in values if v for part in str(v).split(",")]
    paths += [spec.partition(":")[2].strip()
              for spec in evaluation.split_field(given.config.get("eval_files", ""))]
    return paths + [part.strip() for k, v in given.config.items()
                    if isinstance(v, str) and k != "eval_files" for part in v.split(",")]


def main(program: Program, module) -> None:
    """Runs ``program``'s CLI (``module``: the package's ``main`` module, for ``--help``)."""
    module.__doc__ = program.usage_text()
    table = {c.name: c for c in program.commands()}

    def run(argv: list[str]) -> None:
        if len(argv) != 2 or argv[1] not in table:
            got = f" (got {argv[1:]})" if len(argv) > 1 else ""
            sys.exit(f"usage: {program.prog} {{{'|'.join(table)}}} --workdir=DIR [flags]"
                     f"{got}\n{program.prog} --help explains the commands and flags; "
                     f"{program.prog} config lists the config fields")
        command = table[argv[1]]
        if command.needs_workdir and not FLAGS.workdir:
            sys.exit(f"{program.prog} {command.name}: error: --workdir is required (see --help)")
        with cli.user_errors(program.prog, command.name):
            program.fields.check(FLAGS.config)
            if command.name != "config":
                storage.check_endpoint(_paths_given(FLAGS))
            if command.shared_work:
                from embedding_core.distributed import parallel

                config = FLAGS.config  # jax.distributed must start before any device use
                parallel.maybe_initialize_distributed(
                    config.coordinator_address or None, config.num_processes or None,
                    config.process_id if config.process_id >= 0 else None)
            command.run(Invocation(program.prog, command.name, FLAGS.workdir, FLAGS.step,
                                   FLAGS.config, overrides(), FLAGS))

    for flag in FLAGS.get_key_flags_for_module(__name__):  # --help lists the shared flags
        for name in {module.__name__, sys.argv[0]}:  # python -m: absl reads sys.argv[0]
            FLAGS.register_key_flag_for_module(name, flag)
    cli.run_app(run, module)
