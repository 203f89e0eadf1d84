"""One training run per workdir: ``WORKDIR/run.lock``, a JSON record with a heartbeat,
created exclusively, changed by compare-and-write only (``docs/architecture.md``, "One
run per workdir")."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote

from etils import epath

from embedding_core.storage import storage
from embedding_core.training.run_control import WorkdirInUseError

LOCK_NAME = "run.lock"
GUARD_NAME = ".run.lock.guard"  # flock'ed around each compare-and-write of a local lock
HEARTBEAT_S = 30.0  # seconds between a live run's heartbeats
STALE_AFTER_S = 300.0  # a heartbeat older than this is taken over (a crash elsewhere)

_T = TypeVar("_T")


def _boot_id() -> str:
    # Tells machines sharing a host name (and reboots) apart: a pid is checked only at home.
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    try:  # the kernel's start time (Linux), None where /proc cannot tell
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if fields and fields[0] == "Z":  # a zombie has exited: it runs nothing
        return "zombie"
    return fields[19] if len(fields) > 19 else None


def _process_gone(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    now = _process_start(pid)
    if now == "zombie":
        return True
    # The same pid with another start time is a new process that reused the number.
    return start is not None and now is not None and now != start


def _is_local(path: epath.Path) -> bool:
    return not storage.is_remote(path)


class WorkdirLock:
    """The lock of one workdir, a context manager. Raises ValueError unless
    ``stale_after_s > heartbeat_s``."""

    def __init__(self, workdir: str | os.PathLike, *, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S):
        if stale_after_s <= heartbeat_s:
            raise ValueError(f"stale_after_s={stale_after_s} must exceed heartbeat_s="
                             f"{heartbeat_s} (a live run would look stale)")
        self.workdir = storage.as_path(workdir)
        self.path = self.workdir / LOCK_NAME
        self.heartbeat_s = float(heartbeat_s)
        self.stale_after_s = float(stale_after_s)
        self.token = uuid.uuid4().hex
        self.held = False
        self.lost: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def _record(self) -> dict:
        return {"token": self.token, "host": socket.gethostname(), "boot_id": _boot_id(),
                "pid": os.getpid(), "pid_start": _process_start(os.getpid()),
                "started": self._started, "heartbeat": time.time()}

    def read(self) -> dict | None:
        """The record, or None. Raises WorkdirInUseError: not a lock record."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return self._parse(text)

    def _parse(self, text: str) -> dict:
        try:
            record = json.loads(text)
            float(record["heartbeat"]), int(record["pid"]), str(record["token"])
        except (ValueError, KeyError, TypeError):
            raise WorkdirInUseError(
                f"{self.path} is not a run lock this version can read; if no run uses "
                f"{self.workdir}, delete {self.path} and start again") from None
        return record

    def _write(self, record: dict) -> None:
        text = json.dumps(record)
        if _is_local(self.path):
            # Readers must never see half a record: write aside, then rename over.
            tmp = self.path.with_name(f".{LOCK_NAME}.{self.token}.tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)
        else:
            self.path.write_text(text)  # an object write is atomic

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Exclusive for one compare-and-write of a local lock (``gs://``: generations)."""
        if not _is_local(self.path):
            yield
            return
        guard = os.fspath(self.workdir / GUARD_NAME)
        while True:
            fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:  # a release may have removed the file while we waited: lock the new one
                linked = os.stat(guard).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                linked = False
            if linked:
                break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)  # drops the flock

    def _read_versioned(self) -> tuple[dict | None, str | None]:
        """The record and, on ``gs://``, its generation (one request)."""
        if _is_local(self.path):
            return self.read(), None
        import fsspec

        fs = fsspec.filesystem("gs")
        bucket, key = os.fspath(self.path)[len("gs://"):].split("/", 1)
        try:
            headers, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
        except FileNotFoundError:
            return None, None
        return self._parse(data.decode()), headers.get("x-goog-generation")

    def _replace_if(self, match: Callable[[dict], bool], record: dict | None
                    ) -> tuple[bool, dict | None]:
        """``(done, found)``: ``record`` written (None: deleted) if the lock ``match``es."""
        if _is_local(self.path) and not self.path.exists():
            return False, None  # nothing to compare with (nor a folder for the guard)
        with self._guard():
            found, generation = self._read_versioned()
            if found is None or not match(found):
                return False, found
            if _is_local(self.path):
                if record is None:
                    self.path.unlink(missing_ok=True)
                    os.unlink(os.fspath(self.workdir / GUARD_NAME))  # held: safe (_guard)
                else:
                    self._write(record)
                return True, found
            if self._replace_remote(generation, record):
                return True, found
            return False, self.read()  # rewritten since it was read: by whom, now

    def _replace_remote(self, generation: str | None, record: dict | None) -> bool:
        import fsspec

        fs = fsspec.filesystem("gs")
        bucket, key = os.fspath(self.path)[len("gs://"):].split("/", 1)
        try:
            if generation is None:  # a store without generations: write, then read back
                if record is None:
                    self.path.unlink(missing_ok=True)
                    return True
                self._write(record)
                return (self.read() or {}).get("token") == record["token"]
            if record is None:
                fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=generation)
            else:
                fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
                        uploadType="media", name=key, ifGenerationMatch=generation,
                        data=json.dumps(record).encode(),
                        headers={"Content-Type": "application/octet-stream"})
            return True
        except FileExistsError:  # 412: rewritten since we read it
            return False
        finally:
            fs.invalidate_cache(os.fspath(self.path))

    def _create(self, record: dict) -> bool:
        data = json.dumps(record).encode()
        if _is_local(self.path):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        import fsspec

        if self.path.exists():  # the usual case, and enough where preconditions are ignored
            return False
        try:
            # gcsfs sends ifGenerationMatch=0: the store refuses an object created meanwhile.
            fsspec.filesystem("gs").pipe_file(os.fspath(self.path), data, mode="create")
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError):
            # A file system without exclusive create: check, write, rely on the read-back.
            if self.path.exists():
                return False
            self._write(record)
            return True

    def stale_reason(self, record: dict) -> str | None:
        """Why ``record`` no longer guards a live run, or None when it may."""
        age = time.time() - float(record["heartbeat"])
        if age > self.stale_after_s:
            return f"its last heartbeat was {age:.0f} s ago (over {self.stale_after_s:.0f} s)"
        if (record.get("host") == socket.gethostname() and record.get("boot_id") == _boot_id()
                and _process_gone(int(record["pid"]), record.get("pid_start"))):
            return f"its process {record['pid']} on this machine has exited"
        return None

    def _in_use(self, record: dict) -> WorkdirInUseError:
        age = time.time() - float(record["heartbeat"])
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record["started"])))
        return WorkdirInUseError(
            f"{self.workdir} is in use by another training run (host {record.get('host')}, "
            f"pid {record['pid']}, started {started}, heartbeat {age:.0f} s ago); wait for it "
            f"to end or use another --workdir. If no run uses it (it crashed on another "
            f"machine), delete {self.path}; a lock without a heartbeat for "
            f"{self.stale_after_s:.0f} s is taken over automatically")

    def check_free(self) -> None:
        """Raises WorkdirInUseError (writing nothing) when a live run holds the lock."""
        record = self.read()
        if record is not None and record["token"] != self.token and (
                self.stale_reason(record) is None):
            raise self._in_use(record)

    def acquire(self) -> None:
        """Takes the lock, or over a stale one. Raises WorkdirInUseError: a live run holds
        it, or another won a simultaneous take-over."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._started = time.time()
        record = self._record()
        if not self._create(record):
            held = self.read()
            if held is None:  # released meanwhile
                if not self._create(record):
                    raise self._in_use(self.read() or record)
            else:
                reason = self.stale_reason(held)
                if reason is None:
                    raise self._in_use(held)
                # Replace only the very record judged stale: not one a rival wrote since,
                # nor the holder's own fresh heartbeat.
                done, found = self._replace_if(lambda now: now == held, record)
                if not done:
                    raise self._in_use(found or record)
                logging.warning("took over the lock %s of host %s pid %s: %s", self.path,
                                held.get("host"), held["pid"], reason)
        mine = self.read()
        if mine is None or mine["token"] != self.token:
            raise self._in_use(mine or record)
        self.held = True
        self.lost = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                done, record = self._replace_if(lambda now: now["token"] == self.token,
                                                self._record())
                if not done:
                    self.lost = record or {"host": "?", "pid": "?", "token": ""}
                    logging.error("the lock %s is no longer this run's (now %s)", self.path, record)
                    return
            except Exception as err:  # noqa: BLE001 - a missed beat must not kill training
                logging.warning("could not refresh %s: %s", self.path, err)

    def check(self) -> None:
        """Raises WorkdirInUseError when another run took the lock over (no I/O)."""
        if self.lost is not None:
            raise WorkdirInUseError(
                f"{self.workdir}: another run (host {self.lost.get('host')}, pid "
                f"{self.lost.get('pid')}) took over {self.path}; this run stops without "
                "saving so that the two do not overwrite each other's checkpoints")

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock file if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.held:
            return
        self.held = False
        try:
            self._replace_if(lambda now: now["token"] == self.token, None)
        except Exception as err:  # noqa: BLE001 - never hide the run's own outcome
            logging.warning("could not remove %s: %s (delete it by hand)", self.path, err)

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def on_process_zero(fn: Callable[[], _T]) -> _T | None:
    """``fn()`` on process 0 (None elsewhere; a collective); a ``WorkdirInUseError`` there
    is raised on every process."""
    import jax

    if jax.process_count() == 1:
        return fn()
    import numpy as np
    from jax.experimental import multihost_utils

    result, error = None, None
    if jax.process_index() == 0:
        try:
            result = fn()
        except WorkdirInUseError as err:
            error = err
    ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if error is not None:
        raise error
    if not int(ok):
        raise WorkdirInUseError("process 0 found the workdir in use by another run; its log "
                                "names the run and the lock file")
    return result


@contextlib.contextmanager
def hold(workdir: str | os.PathLike, **kwargs: Any) -> Iterator[WorkdirLock | None]:
    """``workdir``'s lock held on process 0 for the block (``None`` elsewhere). Raises
    WorkdirInUseError on every process when process 0 cannot take it."""
    lock = WorkdirLock(workdir, **kwargs)
    on_process_zero(lock.acquire)
    try:
        yield lock if lock.held else None
    finally:
        lock.release()
