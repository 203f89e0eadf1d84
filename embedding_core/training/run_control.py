"""How a training run stops: signals, ``train``'s exit codes and the errors behind them
(``docs/architecture.md``, "Stopping a run"); imports nothing heavy (the CLI, before JAX)."""

from __future__ import annotations

import logging
import signal
import threading

EXIT_PREEMPTED = 75  # SIGTERM, after saving: resume it (EX_TEMPFAIL)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), after saving

EXIT_CODES_HELP = f"""
Exit codes of train: 0 finished; 1 bad input or settings, a diverged run (non-finite loss,
gradient or params: its last finite checkpoint stays the latest) or a workdir in use by
another run; {EXIT_PREEMPTED} preempted by SIGTERM (checkpoint saved, or nothing to save
before the first step: run the same command to resume); {EXIT_INTERRUPTED} Ctrl-C
(checkpoint saved; a second Ctrl-C aborts without one, naming the latest kept).
"""


class DivergedError(FloatingPointError):
    """A non-finite loss, gradient or parameter; nothing was saved from that state."""


class WorkdirInUseError(RuntimeError):
    """Another live run holds the workdir's lock (or took it over from this run)."""


class Preempted(Exception):  # noqa: N818 - an outcome, not a fault
    """Training stopped on SIGTERM after saving the checkpoint of ``step``."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class Interrupted(KeyboardInterrupt):
    """Stopped on Ctrl-C after saving ``step`` (a ``KeyboardInterrupt``, for notebooks)."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class Aborted(KeyboardInterrupt):
    """A second Ctrl-C stopped training at once (names the latest complete checkpoint)."""

    exit_code = EXIT_INTERRUPTED


class StopRequested(BaseException):
    """A signal in start-up mode (a ``BaseException``: readers wrapping ``Exception`` keep
    it); :class:`StopSignals` turns it into :class:`Preempted` or :class:`Interrupted`."""


def _drop_orbax(record: logging.LogRecord) -> bool:
    return "orbax" not in record.pathname


def quiet_orbax() -> None:
    """Drops orbax's log records (after a second Ctrl-C, ~140 lines of tracebacks)."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and _drop_orbax not in handler.filters:
            handler.addFilter(_drop_orbax)


class StopSignals:
    """SIGTERM and the first Ctrl-C as a request read between steps (``immediate``: at once,
    until :meth:`defer`); a second Ctrl-C raises ``KeyboardInterrupt``. Multi-process:
    SIGTERM through JAX's preemption service."""

    def __init__(self, *, multiprocess: bool = False, immediate: bool = False):
        self.multiprocess = multiprocess
        self.immediate = immediate
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def install(self) -> None:
        """Installs the handlers (main thread, single process, once)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        wanted = () if self.multiprocess else (signal.SIGTERM, signal.SIGINT)
        for signum in wanted:
            self._previous[signum] = signal.signal(signum, self._handle)

    def defer(self) -> None:
        """Leaves start-up mode: a signal is read by the loop between steps."""
        self.immediate = False

    def __exit__(self, exc_type, exc, tb) -> bool:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if isinstance(exc, StopRequested):
            raise self.stopped(-1, "") from None
        return False

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                quiet_orbax()
                raise KeyboardInterrupt("second Ctrl-C: aborting without a checkpoint")
            return
        self.signum = signum
        if self.immediate:
            raise StopRequested()
        if signum == signal.SIGINT:
            logging.warning("Ctrl-C: saving a checkpoint after this step, then stopping "
                            "(Ctrl-C again aborts without one)")
        else:
            logging.warning("SIGTERM: saving a checkpoint after this step, then stopping")

    @property
    def requested(self) -> bool:
        """A signal of this process asked to stop."""
        return self.signum is not None

    def should_stop(self, step: int) -> bool:
        """Stop after ``step``? (multi-process: all agree; call after every step)."""
        if self.multiprocess:
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(step):
                self.signum = self.signum or signal.SIGTERM
                return True
            return False
        return self.requested

    def stopped(self, step: int, where: str) -> Preempted | Interrupted:
        """The exception once ``step`` is saved in ``where`` (``step < 0``: nothing saved)."""
        saved = (f"at step {step}: checkpoint saved in {where}" if step >= 0
                 else "before the first step (nothing to save)")
        if self.signum == signal.SIGINT:
            return Interrupted(f"interrupted (Ctrl-C) {saved}; run the same command to "
                               "resume", step)
        return Preempted(f"preempted (SIGTERM) {saved}; run the same command to resume "
                         f"(exit code {EXIT_PREEMPTED})", step)
