"""One run per workdir: the lock file, its heartbeat, stale take-over, and run()'s refusal."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedding_core.training import run_lock
from embedding_core.training.run import run
from embedding_core.training.run_control import WorkdirInUseError

_spec = importlib.util.spec_from_file_location(
    "stop_worker", Path(__file__).with_name("stop_worker.py"))
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

HANG_GUARD_S = 1800  # only against a hang: no check depends on how fast the machine runs


class _StoppedClock:
    """``run_lock``'s ``time`` module with its clock stopped at ``now``: the ages it reports
    are exactly the planted ones, however long the test takes between two lines."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def _until(condition, what: str) -> None:
    """Waits for the heartbeat thread to make ``condition()`` true (its next beat)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {HANG_GUARD_S} s"
        time.sleep(0.01)


def _plant(workdir: Path, **fields) -> dict:
    """Writes a lock record as another run would have left it."""
    record = {"token": "other", "host": "elsewhere", "boot_id": "x", "pid": 4321,
              "pid_start": None, "started": time.time() - 60, "heartbeat": time.time()}
    record.update(fields)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / run_lock.LOCK_NAME).write_text(json.dumps(record))
    return record


def test_a_second_run_is_refused_until_the_first_releases(tmp_path):
    first = run_lock.WorkdirLock(tmp_path / "w")
    first.acquire()
    try:
        record = json.loads((tmp_path / "w" / "run.lock").read_text())
        assert record["token"] == first.token and record["pid"] == os.getpid()
        assert record["host"] == socket.gethostname()
        second = run_lock.WorkdirLock(tmp_path / "w")
        for attempt in (second.check_free, second.acquire):
            with pytest.raises(WorkdirInUseError) as info:
                attempt()
            message = str(info.value)
            assert message.startswith(f"{tmp_path / 'w'} is in use by another training run "
                                      f"(host {socket.gethostname()}, pid {os.getpid()}, ")
            assert f"delete {tmp_path / 'w' / 'run.lock'}" in message and "\n" not in message
        assert json.loads((tmp_path / "w" / "run.lock").read_text())["token"] == first.token
    finally:
        first.release()
    assert not (tmp_path / "w" / "run.lock").exists()
    with run_lock.WorkdirLock(tmp_path / "w") as again:
        assert again.read()["token"] == again.token


def test_stale_locks_are_taken_over_live_ones_are_not(tmp_path, caplog, monkeypatch):
    now = time.time()
    monkeypatch.setattr(run_lock, "time", _StoppedClock(now))
    lock = run_lock.WorkdirLock(tmp_path, stale_after_s=300)
    _plant(tmp_path, heartbeat=now - 10)  # another machine, heartbeat fresh
    with pytest.raises(WorkdirInUseError, match="pid 4321, .*heartbeat 10 s ago"):
        lock.acquire()
    _plant(tmp_path, heartbeat=now - 301)  # another machine, silent for too long
    with caplog.at_level("WARNING"):
        lock.acquire()
    assert "its last heartbeat was 301 s ago (over 300 s)" in caplog.text
    assert lock.read()["token"] == lock.token
    lock.release()

    # On this machine a lock of an exited process is stale at once (a SIGKILLed run).
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    here = {"host": socket.gethostname(), "boot_id": run_lock._boot_id()}
    _plant(tmp_path, pid=int(gone.stdout), **here)
    lock.acquire()
    assert lock.read()["token"] == lock.token
    lock.release()
    # ... but not one whose process lives (here: this very process, under another token).
    _plant(tmp_path, pid=os.getpid(), pid_start=run_lock._process_start(os.getpid()), **here)
    with pytest.raises(WorkdirInUseError):
        lock.acquire()
    # A file that is not a lock record is left alone and named.
    (tmp_path / "run.lock").write_text("not json")
    with pytest.raises(WorkdirInUseError, match=f"delete {tmp_path / 'run.lock'}"):
        lock.acquire()
    assert (tmp_path / "run.lock").read_text() == "not json"


def test_the_heartbeat_refreshes_and_a_taken_over_run_stops(tmp_path):
    lock = run_lock.WorkdirLock(tmp_path, heartbeat_s=0.05, stale_after_s=5)
    lock.acquire()
    try:
        beat = lock.read()["heartbeat"]
        _until(lambda: lock.read()["heartbeat"] > beat, "no heartbeat refreshed the lock")
        assert lock.read()["heartbeat"] > beat
        lock.check()  # still ours: no error
        thief = {"token": "thief", "host": "other-host", "pid": 99}
        _plant(tmp_path, **thief)

        def noticed() -> bool:
            # The next beat reads the thief's record and marks the lock lost; a beat that
            # had read the lock just before the plant rewrites it once: plant it again.
            if lock.lost is None and lock.read()["token"] != "thief":
                _plant(tmp_path, **thief)
            return lock.lost is not None

        _until(noticed, "the heartbeat never noticed the take-over")
        with pytest.raises(WorkdirInUseError, match="host other-host, pid 99.*stops without"):
            lock.check()
    finally:
        lock.release()
    assert lock.read()["token"] == "thief"  # release removes only its own lock


def test_run_refuses_a_workdir_in_use_before_loading_anything(tmp_path):
    built = []

    def make_task(config, mesh):
        built.append(1)
        return worker.make_task()(config, mesh)

    with run_lock.WorkdirLock(tmp_path / "w"):
        with pytest.raises(WorkdirInUseError, match="is in use by another training run"):
            run(make_task, worker.config(4), tmp_path / "w")
    assert not built  # refused before the data loads
    assert [p.name for p in (tmp_path / "w").iterdir()] == []  # the lock went with its holder


def test_the_lock_works_on_gcs(gcs_emulator):
    workdir = "gs://test-bucket/lock-test"  # the emulator's bucket (tests/gcs_emulator.py)
    first = run_lock.WorkdirLock(workdir)
    with first:
        assert first.read()["token"] == first.token
        with pytest.raises(WorkdirInUseError, match=f"delete {workdir}/run.lock"):
            run_lock.WorkdirLock(workdir).acquire()
    assert not first.path.exists()


def _beat_paused_after_its_read(lock, method: str):
    """Wraps ``lock.<method>`` so that the heartbeat thread's first call sets ``read`` and
    then waits for ``go``; its second call sets ``again`` (the first beat has finished)."""
    import threading

    events = {name: threading.Event() for name in ("read", "go", "again")}
    real = getattr(lock, method)
    calls = []

    def paused():
        out = real()
        if threading.current_thread().name == "workdir-lock-heartbeat":
            calls.append(1)
            if len(calls) == 1:
                events["read"].set()
                assert events["go"].wait(HANG_GUARD_S)
            elif len(calls) == 2:
                events["again"].set()
        return out

    setattr(lock, method, paused)
    return events


def _take_over(thief, name: str):
    """Starts ``thief.acquire()`` in a thread named ``name``: the thread and the outcome
    ("holds" or "refused") it fills in."""
    import threading

    outcome = {}

    def take():
        try:
            thief.acquire()
            outcome["thief"] = "holds"
        except WorkdirInUseError:
            outcome["thief"] = "refused"

    thread = threading.Thread(target=take, name=name)
    thread.start()
    return thread, outcome


def test_a_heartbeat_never_overwrites_a_lock_taken_over_meanwhile(tmp_path, monkeypatch):
    """The holder's beat reads its record; a second run, judging it stale, takes over before
    the beat writes. Only one of them may end up thinking it holds the lock."""
    import fcntl
    import threading

    holder = run_lock.WorkdirLock(tmp_path, heartbeat_s=0.01, stale_after_s=60)
    thief = run_lock.WorkdirLock(tmp_path, stale_after_s=60)
    thief.stale_reason = lambda record: "judged stale by the test"
    events = _beat_paused_after_its_read(holder, "read")
    thief_waits = threading.Event()
    real_flock = fcntl.flock

    def flock(fd, operation):
        if threading.current_thread().name == "thief" and operation == fcntl.LOCK_EX:
            try:
                return real_flock(fd, operation | fcntl.LOCK_NB)
            except BlockingIOError:
                thief_waits.set()  # the holder's beat is between its read and its write
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    holder.acquire()
    try:
        assert events["read"].wait(HANG_GUARD_S)
        thread, outcome = _take_over(thief, "thief")
        # Let the beat go on once the thief has finished, or waits for the beat's guard.
        done = threading.Thread(target=lambda: (thread.join(), thief_waits.set()))
        done.start()
        assert thief_waits.wait(HANG_GUARD_S)
        events["go"].set()
        thread.join(HANG_GUARD_S)
        assert events["again"].wait(HANG_GUARD_S)  # the paused beat has written (or not)
        owners = [name for name, lock in (("holder", holder), ("thief", thief))
                  if lock.held and lock.lost is None]
        assert len(owners) == 1, (owners, outcome)
        assert holder.read()["token"] == {"holder": holder.token,
                                          "thief": thief.token}[owners[0]]
        assert outcome == {"thief": "refused"}  # the beat came first: the holder is live
    finally:
        events["go"].set()
        holder.release()
        thief.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # lock and guard gone


def test_a_gcs_heartbeat_never_overwrites_a_lock_taken_over_meanwhile(gcs_emulator):
    workdir = "gs://test-bucket/lock-race"
    holder = run_lock.WorkdirLock(workdir, heartbeat_s=0.01, stale_after_s=60)
    thief = run_lock.WorkdirLock(workdir, stale_after_s=60)
    thief.stale_reason = lambda record: "judged stale by the test"
    events = _beat_paused_after_its_read(holder, "_read_versioned")
    holder.acquire()
    try:
        assert events["read"].wait(HANG_GUARD_S)
        thread, outcome = _take_over(thief, "thief")
        thread.join(HANG_GUARD_S)  # no guard on gs://: the take-over completes
        assert outcome == {"thief": "holds"}
        events["go"].set()  # the beat writes at the generation it read: refused (412)
        thread = holder._thread
        thread.join(HANG_GUARD_S)  # a lost lock ends the heartbeat
        assert holder.lost is not None and holder.lost["token"] == thief.token
        with pytest.raises(WorkdirInUseError, match="took over"):
            holder.check()
        assert thief.read()["token"] == thief.token
    finally:
        events["go"].set()
        holder.release()
        thief.release()
    assert not thief.path.exists()
