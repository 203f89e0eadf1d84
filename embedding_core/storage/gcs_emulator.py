"""A local ``gs://`` (the ``gcs-emulator`` extra): ``gcp-storage-emulator`` plus the object
generations tensorstore needs: ``x-goog-generation`` on downloads, 304 on
``ifGenerationNotMatch``, 412 on a failed ``ifGenerationMatch`` (``docs/architecture.md``,
"Storage")."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlparse

BUCKET = "test-bucket"  # the tests' bucket
DEFAULT_PORT = 9023  # gcp-storage-emulator's own default


class GcsEmulator:
    """The emulator on a thread of this process (``port=0``: a free one); objects in memory
    unless ``data_dir``. Test hooks: :meth:`pause`, :meth:`fail`."""

    def __init__(self, host: str = "localhost", port: int = 0,
                 buckets: Sequence[str] = (BUCKET,), data_dir: str | None = None) -> None:
        from gcp_storage_emulator import server
        from gcp_storage_emulator.handlers import buckets as bucket_handlers
        from gcp_storage_emulator.handlers import objects

        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.port = port
        self.host = f"{host}:{port}"
        self._gates: list[dict] = []
        self._faults: list[tuple[str, int]] = []
        handle, download = server.Router.handle, objects.download
        gates, faults = self._gates, self._faults

        def handle_with_generations(router, method):
            url = unquote(router._request_handler.path)
            for gate in gates:
                if gate["armed"] and gate["at"] in url and not gate["reached"].is_set():
                    gate["reached"].set()
                    gate["release"].wait(timeout=1800)  # clear_gates() releases it; a hang guard
            try:
                fault = next((status for at, status in faults if at in url), None)
                if fault is not None:
                    _answer(router._request_handler, method, server, HTTPStatus(fault))
                elif not _precondition_failed(router._request_handler, method, server):
                    handle(router, method)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on the answer (a cancelled read, a killed run)
            for gate in gates:
                if method in ("POST", "PUT") and gate["after"] in url:
                    gate["armed"] = True

        def download_with_generation(request, response, storage, *args, **kwargs):
            obj = _object(storage, request.params["bucket_name"], request.params["object_id"])
            if obj is not None:
                response["x-goog-generation"] = str(obj["generation"])
                response["x-goog-metageneration"] = str(obj["metageneration"])
            return download(request, response, storage, *args, **kwargs)

        def restore() -> None:
            server.Router.handle = handle
            objects.download = download

        self._restore = restore
        server.Router.handle = handle_with_generations
        objects.download = download_with_generation  # objects.get calls it by name
        # A read of a missing object is ordinary traffic (exists() checks), not an error.
        logging.getLogger("gcp_storage_emulator.storage").addFilter(
            lambda r: r.msg != "Resource not found:" and not isinstance(r.msg, OSError))
        self._server = server.create_server(host, self.port, in_memory=data_dir is None,
                                            data_dir=data_dir)
        for name in buckets:
            bucket_handlers.create_bucket(name, self._server._storage)
        self._server.start()

    def pause(self, at: str, after: str) -> dict:
        """Holds the first request whose URL has ``at`` once a write to ``after`` is done:
        ``gate["reached"]`` set; :meth:`clear_gates` lets it through."""
        gate = {"at": at, "after": after, "armed": False,
                "reached": threading.Event(), "release": threading.Event()}
        self._gates.append(gate)
        return gate

    def clear_gates(self) -> None:
        for gate in self._gates:
            gate["release"].set()
        self._gates.clear()

    def fail(self, at: str, status: int = HTTPStatus.FORBIDDEN) -> None:
        """Answers requests whose URL has ``at`` with ``status`` until :meth:`clear_faults`."""
        self._faults.append((at, int(status)))

    def clear_faults(self) -> None:
        self._faults.clear()

    def stop(self) -> None:
        self.clear_gates()
        self._server.stop()
        self._restore()


def _object(storage, bucket: str, name: str) -> dict | None:
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return storage.get_file_obj(bucket, name)
    except NotFound:
        return None


def _answer(handler, method: str, server, status: HTTPStatus) -> None:
    """Answers ``status`` with a GCS-style JSON error (304: no body)."""
    if method in ("POST", "PUT", "PATCH"):
        server.Request(handler, method).data  # noqa: B018 - read off a kept-alive connection
    response = server.Response(handler)
    response.status = status
    if status != HTTPStatus.NOT_MODIFIED:
        response.json({"error": {"code": status.value, "message": status.phrase}})
    response.close()


def _precondition_failed(handler, method: str, server) -> bool:
    """Answers 304 or 412 itself when a generation condition fails; else False."""
    parsed = urlparse(handler.path)
    query = parse_qs(parsed.query)
    match = query.get("ifGenerationMatch", [None])[0]
    not_match = query.get("ifGenerationNotMatch", [None])[0]
    if match is None and not_match is None:
        return False
    parts = unquote(parsed.path).split("/")
    # /storage/v1/b/B/o/NAME (read) or /upload/storage/v1/b/B/o?name=NAME (write)
    if method == "GET" and len(parts) >= 7 and parts[3] == "b" and parts[5] == "o":
        bucket, name = parts[4], "/".join(parts[6:])
    elif method == "POST" and parts[:2] == ["", "upload"] and "name" in query:
        bucket, name = parts[5], query["name"][0]
    else:
        return False
    obj = _object(handler.storage, bucket, name)
    if obj is None and method == "GET":
        return False  # the emulator's 404
    current = None if obj is None else str(obj["generation"])
    if match is not None and (current or "0") != match:
        _answer(handler, method, server, HTTPStatus.PRECONDITION_FAILED)
        return True
    if not_match is not None and current is not None and current == not_match:
        _answer(handler, method, server, HTTPStatus.NOT_MODIFIED)
        return True
    return False


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m embedding_core.storage.gcs_emulator``: serves until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m embedding_core.storage.gcs_emulator",
        description="A local gs:// for embedding-jax runs (gcp-storage-emulator with the "
                    "object generations orbax needs). Then: "
                    "export STORAGE_EMULATOR_HOST=HOST:PORT")
    parser.add_argument("--host", default="localhost", help="address to serve on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0: a free one)")
    parser.add_argument("--bucket", action="append", default=None,
                        help="bucket to create (may repeat; default: bucket)")
    parser.add_argument("--data_dir", default=None,
                        help="keep objects in this folder (default: in memory, gone when "
                             "the emulator stops)")
    args = parser.parse_args(argv)
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError:
        sys.exit("error: the GCS emulator needs gcp-storage-emulator: "
                 "pip install 'embedding-jax[gcs-emulator]'")
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    buckets = args.bucket or ["bucket"]
    try:
        emulator = GcsEmulator(args.host, args.port, buckets, args.data_dir)
    except OSError as err:
        sys.exit(f"error: cannot serve on {args.host}:{args.port}: {err}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"GCS emulator on http://{emulator.host}, buckets "
          f"{', '.join('gs://' + b for b in buckets)}; in another shell: "
          f"export STORAGE_EMULATOR_HOST={emulator.host}", flush=True)
    while not stop.wait(0.5):
        pass
    emulator.stop()
    print(f"GCS emulator on {emulator.host} stopped", flush=True)


if __name__ == "__main__":
    main()
