"""One path type for local files and ``gs://`` URIs, the GCS emulator wiring and the
start-of-run checks of a ``gs://`` endpoint (``docs/architecture.md``, "Storage")."""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterable, Iterator
from urllib.parse import quote, unquote, urlparse

from etils import epath

from embedding_core.errors import MissingPathError, StorageError

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CACHE_ENV = "EMBEDDING_JAX_CACHE"
TENSORSTORE_URL_ENV = "TENSORSTORE_GCS_HTTP_URL"
TOKEN_ENV = "GOOGLE_AUTH_TOKEN_FOR_TESTING"
TIMEOUT_ENV = "EMBEDDING_JAX_GCS_TIMEOUT"
DEFAULT_TIMEOUT = 20.0
EMULATOR_COMMAND = "python -m embedding_core.storage.gcs_emulator"
GCS_HOST = "storage.googleapis.com"
_SCHEME = "gs://"
_EMULATOR_TOKEN = "emulator"
_GCSFS_PATH = re.compile(r"(?<![\w/])b/([\w.-]+)/o(?:/([^\s:]+))?")
_COPY_CHUNK = 1 << 22


def emulator_url() -> str | None:
    """``$STORAGE_EMULATOR_HOST`` as an ``http://host:port`` URL, or None when unset."""
    host = os.environ.get(EMULATOR_ENV, "").strip()
    if not host or host == "default":
        return None
    return host if "://" in host else f"http://{host}"


def configure() -> None:
    """Routes ``gs://`` through fsspec/gcsfs and every layer to the emulator, if any
    (idempotent)."""
    os.environ["EPATH_USE_TF"] = "false"
    # epath caches its "is TensorFlow installed" answer; a path built before this call
    # (e.g. by tensorflow-datasets) must not pin the TF backend for the whole process.
    from etils.epath import gpath

    cached = getattr(gpath, "_is_tf_installed", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()
    url = emulator_url()
    if url is not None:
        os.environ[EMULATOR_ENV] = url
        os.environ[TENSORSTORE_URL_ENV] = url
        # gcsfs >= 2025 probes bucket types through an API no emulator serves.
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        os.environ.setdefault(TOKEN_ENV, _EMULATOR_TOKEN)
    elif os.environ.get(TOKEN_ENV) == _EMULATOR_TOKEN:
        del os.environ[TOKEN_ENV]


def cache_dir() -> pathlib.Path:
    """``$EMBEDDING_JAX_CACHE``, else ``~/.cache/embedding_jax`` (not created)."""
    env = os.environ.get(CACHE_ENV)
    return pathlib.Path(env).expanduser() if env else (
        pathlib.Path.home() / ".cache" / "embedding_jax")


def absolute_data_paths(config, fields: Iterable[str]):
    """The config, its (comma-separated) local path ``fields`` made absolute in place."""
    for name in fields:
        if name not in config:
            continue
        parts = [p.strip() for p in str(config.get(name, "") or "").split(",") if p.strip()]
        # abspath, not resolve: a symlink (current.csv -> v2.csv) stays the name the user
        # gave; its target's content is what the data fingerprint checks.
        config[name] = ",".join(p if "://" in p else os.path.abspath(os.path.expanduser(p))
                                for p in parts)
    return config


def check_data_paths(config, fields: Iterable[str]) -> None:
    """Raises MissingPathError (``config.FIELD: PATH does not exist``) or ValueError (a
    bucket) for a path in ``fields`` that names nothing."""
    for name in fields:
        value = str(config.get(name, "") or "") if name in config else ""
        for part in filter(None, (p.strip() for p in value.split(","))):
            check_not_bucket(part, f"config.{name}: ")
            if not as_path(part).exists():
                raise MissingPathError(f"config.{name}: {display(part)} does not exist")


def check_not_bucket(path: str | os.PathLike, prefix: str = "") -> None:
    """Raises ValueError for a bare ``gs://BUCKET/`` (fsspec: "Attempt to open a bucket")."""
    text = os.fspath(path)
    if is_remote(text) and "/" not in text[len(_SCHEME):].strip("/"):
        as_path(text)  # gs:// alone: its own error (no bucket)
        raise ValueError(f"{prefix}{text} is a bucket, not a file; name a file (or folder) "
                         f"in it: {_SCHEME}{text[len(_SCHEME):].strip('/')}/PATH")


def describe_error(err: BaseException) -> str:
    """``str(err)`` with gcsfs's request paths (``b/BUCKET/o/OBJECT``) as ``gs://`` URIs."""
    text = _GCSFS_PATH.sub(lambda m: f"{_SCHEME}{m[1]}" + (f"/{unquote(m[2])}" if m[2] else ""),
                           str(err))
    if isinstance(err, FileNotFoundError) and is_remote(text) and " " not in text.strip():
        text = f"{text.strip()} does not exist"
    return text


class StorageUnavailableError(StorageError):
    """A ``gs://`` endpoint a run cannot use (one line: the URI and what to do)."""


_checked: set[str] = set()


def gcs_timeout() -> float:
    """``$EMBEDDING_JAX_GCS_TIMEOUT`` seconds, default 20."""
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)


def check_endpoint(uris: Iterable[str | os.PathLike]) -> None:
    """Once per process, that the endpoint of the ``gs://`` URIs among ``uris`` answers and
    serves what orbax needs (``docs/architecture.md``, "Storage").

    Raises: StorageUnavailableError; ValueError: a ``gs://`` URI without a bucket."""
    remote = [os.fspath(u) for u in uris if u and is_remote(u)]
    for one in remote:
        as_path(one)  # a URI without a bucket is its own error, not the endpoint's
    url = emulator_url()
    if not remote or (url or GCS_HOST) in _checked:
        return
    uri = remote[0]
    if url is not None:
        _check_emulator(url, uri, gcs_timeout())
    else:
        _check_google(uri, gcs_timeout())
    _checked.add(url or GCS_HOST)


def _check_google(uri: str, timeout: float) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    quiet = logging.getLogger("google.auth")  # "No project ID could be determined"
    level = quiet.level
    try:
        quiet.setLevel(logging.ERROR)
        with warnings.catch_warnings():  # "end user credentials without a quota project"
            warnings.simplefilter("ignore")
            google.auth.default()
    except DefaultCredentialsError:
        raise StorageUnavailableError(
            f"{uri}: no Google Cloud credentials; run `gcloud auth application-default "
            "login` or set GOOGLE_APPLICATION_CREDENTIALS=KEY.json (for a local emulator "
            f"instead: {EMULATOR_COMMAND}, then {EMULATOR_ENV}=localhost:PORT)") from None
    finally:
        quiet.setLevel(level)
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy")):
        return  # the clients go through the proxy: a direct connection proves nothing
    host = GCS_HOST
    _retry(lambda left: socket.create_connection((host, 443), timeout=left).close(),
           timeout, lambda why: f"{uri}: cannot reach {host}:443 within {timeout:g} s "
           f"({why}); check the network (${TIMEOUT_ENV} sets the wait), or set "
           f"{EMULATOR_ENV}=localhost:PORT for a local emulator ({EMULATOR_COMMAND})")


def _check_emulator(url: str, uri: str, timeout: float) -> None:
    port = urlparse(url).port or "PORT"
    where = f"the GCS emulator at {url} ({EMULATOR_ENV})"
    bucket = uri[len(_SCHEME):].split("/", 1)[0]
    status, _ = _retry(lambda left: _http("GET", f"{url}/storage/v1/b/{bucket}", left),
                       timeout, lambda why: f"{uri}: nothing answers at {url} "
                       f"({EMULATOR_ENV}) within {timeout:g} s ({why}); start an emulator "
                       f"there ({EMULATOR_COMMAND} --port={port}), or unset {EMULATOR_ENV} "
                       "to use Google Cloud Storage")
    if status == 404:
        raise StorageUnavailableError(f"{uri}: {where} has no bucket {bucket!r}; start it "
                                      f"with {EMULATOR_COMMAND} --port={port} --bucket={bucket}")
    name = quote(f".embedding-jax-probe/{uuid.uuid4().hex}", safe="")
    upload_url = f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
    object_url = f"{url}/storage/v1/b/{bucket}/o/{name}"
    try:
        _http("POST", upload_url, timeout, b"probe")
        _, headers = _http("GET", f"{object_url}?alt=media", timeout)
        guarded, _ = _http("POST", f"{upload_url}&ifGenerationMatch=0", timeout, b"probe")
    except OSError as err:
        raise StorageUnavailableError(f"{uri}: {where} failed a probe write ({err})") from None
    finally:
        try:
            _http("DELETE", object_url, timeout)
        except OSError:
            pass
    lacks = ("sends no object generation (x-goog-generation) with a download"
             if not headers.get("x-goog-generation") else
             "ignores ifGenerationMatch=0 on an existing object" if guarded != 412 else "")
    if lacks:
        raise StorageUnavailableError(
            f"{uri}: {where} {lacks}, which orbax's checkpoint writer needs (the stock "
            f"gcp-storage-emulator does not keep them); serve gs:// with {EMULATOR_COMMAND} "
            f"--port={port} instead")


def _http(method: str, url: str, timeout: float, data: bytes | None = None):
    """``(status, headers)`` of one request, straight to ``url`` (no proxy)."""
    request = urllib.request.Request(url, data=data, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=max(timeout, 0.1)) as response:
            response.read()
            return response.status, response.headers
    except urllib.error.HTTPError as err:
        return err.code, err.headers


def _retry(attempt, timeout: float, message):
    """``attempt(seconds_left)`` until it returns; ``OSError`` past ``timeout`` raises
    ``StorageUnavailableError(message(reason))``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return attempt(max(deadline - time.monotonic(), 0.1))
        except OSError as err:
            if time.monotonic() + 0.25 >= deadline:
                reason = getattr(err, "reason", err)  # urllib wraps the socket's error
                why = getattr(reason, "strerror", None) or reason
                raise StorageUnavailableError(message(why)) from None
            time.sleep(0.25)


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a ``gs://`` URI."""
    return os.fspath(path).startswith(_SCHEME)


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local path (``~`` expanded) or ``gs://bucket/object`` URI as an ``epath.Path``.

    Raises: TypeError: bytes. ValueError: another scheme, no bucket, or ``gs:/`` with one
    slash (a URI that went through pathlib)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        raise TypeError(f"path must be text, got bytes {text!r}")
    if text.startswith(_SCHEME):
        if not text[len(_SCHEME):].split("/", 1)[0]:
            raise ValueError(f"{text}: a gs:// URI needs a bucket (gs://BUCKET/path)")
        return epath.Path(text)
    if text.startswith("gs:/"):
        raise ValueError(f"{text}: not a gs:// URI (one slash after 'gs:'; was it passed "
                         f"through pathlib?); write gs://{text[4:].lstrip('/')}")
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if scheme and scheme.isidentifier():
        raise ValueError(f"{text}: only local paths and gs:// URIs are supported")
    return epath.Path(os.path.expanduser(text))


def display(path: str | os.PathLike) -> str:
    """An absolute, printable form: a ``gs://`` URI as it is, a local path resolved."""
    path = as_path(path)
    return os.fspath(path) if is_remote(path) else str(pathlib.Path(path).resolve())


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` in one upload (readers see the old or the new object, never a mix)."""
    with as_path(path).open("wb") as f:
        f.write(data)


def upload(local_file: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Copies a local file to ``dest``, streaming."""
    with open(local_file, "rb") as src, as_path(dest).open("wb") as out:
        shutil.copyfileobj(src, out, _COPY_CHUNK)


def _source_key(path: epath.Path) -> str:
    """The object's GCS generation, else its checksum, else size and modification time."""
    import fsspec

    info = fsspec.filesystem("gs").info(os.fspath(path))
    for field in ("generation", "md5Hash", "crc32c"):
        if info.get(field):
            return f"{field}:{info[field]}"
    return f"size:{info.get('size')}:{info.get('mtime')}"


def local_copy(path: str | os.PathLike, cache: str | os.PathLike | None = None) -> pathlib.Path:
    """``path`` itself when local, else a copy of the ``gs://`` file or folder under
    ``cache`` (default ``cache_dir()/gcs``), fetched again when it changed.

    Raises: FileNotFoundError: nothing at ``path``."""
    path = as_path(path)
    if not is_remote(path):
        return pathlib.Path(os.fspath(path))
    if cache is None:
        cache = cache_dir() / "gcs"
    cache = pathlib.Path(cache)
    rel = os.fspath(path)[len(_SCHEME):].rstrip("/")
    if path.is_file():
        _fetch(path, cache, rel)
    elif path.is_dir():
        for src, name in _walk_files(path, ""):
            _fetch(src, cache, f"{rel}/{name}")
    else:
        raise FileNotFoundError(f"{path} does not exist")
    return cache / rel


def _walk_files(folder: epath.Path, prefix: str) -> Iterator[tuple[epath.Path, str]]:
    for child in sorted(folder.iterdir(), key=lambda p: p.name):
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            yield from _walk_files(child, rel + "/")
        else:
            yield child, rel


def _fetch(src: epath.Path, cache: pathlib.Path, rel: str) -> None:
    # Versions are kept apart (bucket names cannot start with a dot): a copied folder holds
    # exactly the remote files.
    target, stamp = cache / rel, cache / ".versions" / rel
    key = _source_key(src)
    if target.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8") == key:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            shutil.copyfileobj(f, out, _COPY_CHUNK)
        os.replace(tmp, target)
        stamp.write_text(key, encoding="utf-8")
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)


class MirroredFolder:
    """A local folder uploaded to its ``gs://`` target on :meth:`sync` (TensorBoard's writer
    cannot reach an emulator); a local target is written directly."""

    def __init__(self, target: str | os.PathLike) -> None:
        self.target = as_path(target)
        self.remote = is_remote(self.target)
        if self.remote:
            self.local = pathlib.Path(tempfile.mkdtemp(prefix="embedding_jax_mirror."))
        else:
            self.local = pathlib.Path(os.fspath(self.target))
        self._sent: dict[str, tuple[int, int]] = {}

    def sync(self) -> list[str]:
        """Uploads the files new or changed since the last sync; returns their paths."""
        if not self.remote or not self.local.is_dir():
            return []
        sent = []
        for file in sorted(p for p in self.local.rglob("*") if p.is_file()):
            rel = file.relative_to(self.local).as_posix()
            info = file.stat()
            version = (info.st_size, info.st_mtime_ns)
            if self._sent.get(rel) != version:
                upload(file, self.target / rel)
                self._sent[rel] = version
                sent.append(rel)
        return sent

    def close(self) -> None:
        """Last :meth:`sync`, then removes the local copy (remote targets only)."""
        if self.remote:
            try:
                self.sync()
            finally:
                shutil.rmtree(self.local, ignore_errors=True)


_HASH_BLOCK = 1 << 22


def content_hash(path) -> str:
    """``sha256:HEX`` of the bytes, or GCS's ``md5:``/``crc32c:`` of a ``gs://`` object."""
    if is_remote(path):
        import fsspec

        info = fsspec.filesystem("gs").info(os.fspath(path))
        for key, name in (("md5Hash", "md5"), ("crc32c", "crc32c")):
            if info.get(key):
                return f"{name}:{info[key]}"
    digest = hashlib.sha256()
    with as_path(path).open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"
