"""A local HTTP server speaking the Hugging Face hub's file protocol (the endpoints
``huggingface_hub.snapshot_download`` / ``hf_hub_download`` use), for ``HF_ENDPOINT``.

Serves model repos from memory: ``GET /api/models/<repo>/revision/<rev>`` (repo info with
the commit sha), ``GET /api/models/<repo>/tree/<rev>`` (the file listing) and
``HEAD``/``GET /<repo>/resolve/<rev>/<path>`` (``X-Repo-Commit``, ``ETag``, the bytes).
Unknown repos, revisions and files answer 404 with the hub's ``X-Error-Code``. Every
request path is logged (``requests``), so a test can check what was fetched.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import pathlib
import threading
import urllib.parse


class Repo:
    """One repo at one commit: ``{path: bytes}``; the commit is a hash of its content."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path])
        self.commit = digest.hexdigest()

    @classmethod
    def from_folder(cls, folder: str | pathlib.Path) -> Repo:
        folder = pathlib.Path(folder)
        return cls({p.relative_to(folder).as_posix(): p.read_bytes()
                    for p in sorted(folder.rglob("*")) if p.is_file()})


def _is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin"))


def _etag(data: bytes, lfs: bool) -> str:
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


class HubServer:
    """``with HubServer({"org/name": Repo(...)}) as hub: os.environ["HF_ENDPOINT"] =
    hub.url``."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:  # noqa: N802
                server._answer(self, body=False)

            def do_GET(self) -> None:  # noqa: N802
                server._answer(self, body=True)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _find(self, parts: list[str]) -> tuple[str, Repo, list[str]] | None:
        repo_id = "/".join(parts[:2])
        return (repo_id, self.repos[repo_id], parts[2:]) if repo_id in self.repos else None

    def _answer(self, h: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        url = urllib.parse.urlsplit(h.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        self.requests.append(f"{h.command} {url.path}")
        if parts[:2] == ["api", "models"]:
            found = self._find(parts[2:])
            if found is None:
                return self._error(h, "RepoNotFound")
            repo_id, repo, rest = found
            if len(rest) >= 2 and rest[1] != "main" and rest[1] != repo.commit:
                return self._error(h, "RevisionNotFound")
            if rest[:1] == ["revision"]:
                return self._json(h, {"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                      "private": False,
                                      "siblings": [{"rfilename": p} for p in repo.files]})
            if rest[:1] == ["tree"]:
                listing = []
                for p, data in repo.files.items():
                    entry = {"type": "file", "path": p, "size": len(data),
                             "oid": _etag(data, False)}
                    if _is_lfs(p):
                        entry["lfs"] = {"oid": _etag(data, True), "size": len(data),
                                        "pointerSize": 134}
                    listing.append(entry)
                return self._json(h, listing)
            return self._error(h, "EntryNotFound")
        if len(parts) >= 5 and parts[2] == "resolve":
            found = self._find(parts)
            if found is None:
                return self._error(h, "RepoNotFound")
            _, repo, rest = found
            revision, path = rest[1], "/".join(rest[2:])
            if revision not in ("main", repo.commit):
                return self._error(h, "RevisionNotFound")
            if path not in repo.files:
                return self._error(h, "EntryNotFound")
            data = repo.files[path]
            h.send_response(200)
            h.send_header("X-Repo-Commit", repo.commit)
            h.send_header("ETag", f'"{_etag(data, _is_lfs(path))}"')
            h.send_header("Content-Length", str(len(data)))
            h.send_header("Content-Type", "application/octet-stream")
            h.end_headers()
            if body:
                h.wfile.write(data)
            return None
        return self._error(h, "RepoNotFound")

    @staticmethod
    def _json(h, obj) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    @staticmethod
    def _error(h, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        h.send_response(404)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
