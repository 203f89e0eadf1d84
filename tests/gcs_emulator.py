"""A real GCS emulator (``gcp-storage-emulator``) for the tests, with the object-generation
semantics it lacks and tensorstore relies on.

The emulator serves the JSON API from memory but ignores ``ifGenerationMatch`` /
``ifGenerationNotMatch`` and sends no ``x-goog-generation`` header with a download;
tensorstore's OCDBT writer (orbax's array format) reads the header back after each write
and fails with "Malformed StorageGeneration" without it. :class:`GcsEmulator` adds these
three GCS behaviours around the emulator's own request handling:

- a download carries ``x-goog-generation`` / ``x-goog-metageneration``;
- ``ifGenerationNotMatch=G`` on a read of generation ``G`` answers 304 Not Modified;
- ``ifGenerationMatch`` on a read or an upload that does not hold answers 412
  (``0``: the object must not exist).
"""

from __future__ import annotations

import socket
import threading
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlparse

BUCKET = "test-bucket"


class GcsEmulator:
    """The emulator in memory on a free localhost port, from a thread of this process.

    ``pause(at, after)`` holds the first request whose URL contains ``at``, once a write
    whose URL contains ``after`` has completed: a test kills a writer at a known point (the
    server is single-threaded, so nothing else is served while a request is held).
    """

    def __init__(self) -> None:
        from gcp_storage_emulator import server
        from gcp_storage_emulator.handlers import objects

        with socket.socket() as s:
            s.bind(("localhost", 0))
            self.port = s.getsockname()[1]
        self.host = f"localhost:{self.port}"
        self._gates: list[dict] = []
        handle, download = server.Router.handle, objects.download
        gates = self._gates

        def handle_with_generations(router, method):
            url = unquote(router._request_handler.path)
            for gate in gates:
                if gate["armed"] and gate["at"] in url and not gate["reached"].is_set():
                    gate["reached"].set()
                    gate["release"].wait(timeout=1800)  # clear_gates() releases it; a hang guard
            try:
                if not _precondition_failed(router._request_handler, method, server):
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
        self._server = server.create_server("localhost", self.port, in_memory=True,
                                            default_bucket=BUCKET)
        self._server.start()

    def pause(self, at: str, after: str) -> dict:
        """A gate: ``gate["reached"]`` is set when the request is held; clear_gates() lets
        it through."""
        gate = {"at": at, "after": after, "armed": False,
                "reached": threading.Event(), "release": threading.Event()}
        self._gates.append(gate)
        return gate

    def clear_gates(self) -> None:
        for gate in self._gates:
            gate["release"].set()
        self._gates.clear()

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
    request = server.Request(handler, method)
    obj = _object(handler.storage, bucket, name)
    if obj is None and method == "GET":
        return False  # the emulator's 404
    current = None if obj is None else str(obj["generation"])
    status = None
    if match is not None and (current or "0") != match:
        status = HTTPStatus.PRECONDITION_FAILED
    elif not_match is not None and current is not None and current == not_match:
        status = HTTPStatus.NOT_MODIFIED
    if status is None:
        return False
    if method == "POST":
        request.data  # noqa: B018 - the body must be read off a kept-alive connection
    response = server.Response(handler)
    response.status = status
    if status == HTTPStatus.PRECONDITION_FAILED:
        response.json({"error": {"code": 412, "message": "Precondition Failed"}})
    response.close()
    return True
