"""Training metrics a person can read: TensorBoard scalars, ``metrics.jsonl`` and
``plots/training.png`` (``docs/architecture.md``, "What a workdir holds"). A row:
``{"step": 50, "split": "train" | "eval", "wall_time": ..., "<metric>": value | null}``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from embedding_core.storage import files, storage

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "plots/training.png"
TRAIN, EVAL = "train", "eval"
_RESERVED = ("step", "split", "wall_time")


def parse_metrics(text: str, source: str = METRICS_FILE) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` text (an unfinished last line skipped).
    Raises ValueError: ``"<source>, line N: ..."``."""
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last "\n": empty, or an unfinished line
    rows = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}, line {number}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or isinstance(row.get("step"), bool) or \
                not isinstance(row.get("step"), int):
            raise ValueError(f"{source}, line {number}: field 'step': expected an object "
                             "with an integer step")
        rows.append(row)
    return rows


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of ``workdir/metrics.jsonl`` (``[]`` when absent; non-finite: None).
    Raises ValueError: a malformed line."""
    path = storage.as_path(workdir) / METRICS_FILE
    if not path.exists():
        return []
    return parse_metrics(path.read_text(encoding="utf-8"), os.fspath(path))


class MetricLog:
    """The metrics of one invocation from ``start_step``; ``active``: this process writes
    the files. Raises ValueError: a malformed ``metrics.jsonl``."""

    def __init__(self, workdir: str | os.PathLike, *, start_step: int = 0,
                 active: bool = True) -> None:
        self.workdir = storage.as_path(workdir)
        self.active = active
        self._writer = None
        self._jsonl = None
        if not active:
            return
        self._mirror = storage.MirroredFolder(self.workdir)
        local = self._mirror.local
        local.mkdir(parents=True, exist_ok=True)
        # Keep the history up to the restored step; later rows are written again.
        kept = [r for r in read_metrics(self.workdir) if r["step"] <= start_step]
        files.write_text_atomic(local / METRICS_FILE, "".join(_json_line(r) for r in kept))
        self._jsonl = open(local / METRICS_FILE, "a", encoding="utf-8")
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self._writer = EventFileWriter(str(local))
        _sort_last(self._writer, local)
        # TensorBoard drops earlier files' events from this step on (they are redone).
        self._writer.add_event(event_pb2.Event(
            wall_time=time.time(), step=start_step + 1,
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def write(self, step: int, metrics: Mapping[str, float], split: str = TRAIN) -> None:
        """Logs ``metrics`` at ``step``. Raises ValueError: an unknown ``split``, a metric
        named ``step``, ``split`` or ``wall_time``."""
        if split not in (TRAIN, EVAL):
            raise ValueError(f"split must be {TRAIN!r} or {EVAL!r}, got {split!r}")
        clash = sorted(set(metrics) & set(_RESERVED))
        if clash:
            raise ValueError(f"metric names {clash} are reserved in {METRICS_FILE}")
        values = {k: float(v) for k, v in metrics.items()}
        logging.info("[%d] %s", step, ", ".join(f"{k}={v:.6g}" for k, v in sorted(values.items())))
        if not self.active:
            return
        now = time.time()
        summary = self._summary_pb2.Summary(value=[
            self._summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._writer.add_event(self._event_pb2.Event(wall_time=now, step=int(step),
                                                     summary=summary))
        row = {"step": int(step), "split": split, "wall_time": round(now, 3),
               **{k: v if math.isfinite(v) else None for k, v in values.items()}}
        self._jsonl.write(_json_line(row))
        self._jsonl.flush()

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """The config's scalar fields for TensorBoard's HPARAMS tab (process 0 only)."""
        if not self.active:
            return
        from tensorboard.plugins.hparams import summary_v2

        kept = {k: v for k, v in hparams.items() if isinstance(v, (bool, int, float, str))}
        self._writer.add_event(self._event_pb2.Event(
            wall_time=time.time(), step=0, summary=summary_v2.hparams_pb(kept)))

    def sync(self) -> None:
        """Flushes the files and uploads them when the workdir is ``gs://``."""
        if not self.active:
            return
        self._writer.flush()
        self._jsonl.flush()
        self._mirror.sync()

    def close(self, *, plot: bool = True) -> None:
        """Closes the files, draws ``plots/training.png`` (a failure only warns), uploads."""
        if not self.active or self._writer is None:
            return
        try:
            self._writer.close()
            self._jsonl.close()
            if plot:
                try:
                    write_training_plot(self._mirror.local, self._mirror.local / PLOT_FILE,
                                        title=storage.display(self.workdir))
                except Exception as e:  # a plot never fails a run
                    logging.warning("could not draw %s: %s", PLOT_FILE, e)
        finally:
            self._writer = None
            self._mirror.close()


def _json_line(row: Mapping[str, Any]) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _series(rows: Sequence[Mapping[str, Any]], split: str, name: str
            ) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for r in rows:
        if r.get("split") == split and r.get(name) is not None:
            steps.append(r["step"])
            values.append(float(r[name]))
    return steps, values


def plot_metrics(rows: Sequence[Mapping[str, Any]], title: str = "") -> bytes:
    """PNG of training loss, learning rate and the [0, 1] evaluation metrics by step.
    Raises ValueError: no training loss in ``rows``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    loss = _series(rows, TRAIN, "loss")
    if not loss[0]:
        raise ValueError("no training loss to plot")
    lr = _series(rows, TRAIN, "learning_rate")
    eval_names = sorted({k for r in rows if r.get("split") == EVAL for k in r}
                        - set(_RESERVED), key=_natural_key)  # recall@2 before recall@10
    curves = {}
    for name in eval_names:
        steps, values = _series(rows, EVAL, name)
        if values and all(0.0 <= v <= 1.0 for v in values):
            curves[name] = (steps, values)
    panels = 2 + bool(curves)
    legend_in = 1.8 if curves else 0.0  # room for the evaluation legend on the right
    width = 4.6 * panels + legend_in
    fig = Figure(figsize=(width, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    # Fixed margins: a constrained layout doubles the drawing time (every run draws it).
    axes = fig.subplots(1, panels, squeeze=False,
                        gridspec_kw=dict(left=1.0 / width, right=1 - (legend_in + 0.1) / width,
                                         bottom=0.13, top=0.86, wspace=0.28))[0]
    axes[0].plot(*loss, color="tab:blue", marker="." if len(loss[0]) < 30 else None)
    axes[0].set_title("training loss")
    axes[1].plot(*lr, color="tab:orange")
    axes[1].set_title("learning rate")
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    if curves:
        # "val_rte_average", "val_rte_implied": the shared "val_rte_" goes to the title.
        prefix = os.path.commonprefix(list(curves)) if len(curves) > 1 else ""
        prefix = prefix[:prefix.rfind("_") + 1]
        for name, (steps, values) in curves.items():
            axes[2].plot(steps, values, marker="o", markersize=3, label=name[len(prefix):])
        axes[2].set_title(f"evaluation ({prefix}*)" if prefix else "evaluation")
        axes[2].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       borderaxespad=0.0)
    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize="medium")
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def write_training_plot(workdir: str | os.PathLike, path: str | os.PathLike | None = None,
                        *, title: str = "") -> None:
    """Draws ``workdir/metrics.jsonl`` into ``path`` (default :data:`PLOT_FILE`).
    Raises ValueError: a malformed ``metrics.jsonl`` or no training loss in it."""
    target = storage.as_path(path) if path is not None else \
        storage.as_path(workdir) / PLOT_FILE
    files.write_bytes_atomic(target, plot_metrics(read_metrics(workdir), title=title))


def _sort_last(writer, folder) -> None:
    """Renames ``writer``'s new event file to sort after every earlier one: TensorBoard
    drops redone steps only from files read before the START event, in name order."""
    import pathlib

    mine = pathlib.Path(writer._file_name)  # the open handle survives the rename
    others = sorted(p.name for p in pathlib.Path(folder).glob("events.out.tfevents.*")
                    if p.name != mine.name)
    if others and others[-1] >= mine.name:
        target = mine.with_name(f"{others[-1]}.{len(others)}")
        os.replace(mine, target)
        writer._file_name = str(target)
