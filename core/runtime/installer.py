"""The pinned OpenCode installer (controller side): registry package -> verified, cached ``opencode`` binary.

Over 800 lines on purpose: one flow (metadata, resumable download, integrity, extraction, atomic
commit) under one shared flight and one file lock; split, its error paths would cross modules.

Flow: fetch ``{registry}/{package}/{version}``, download ``dist.tarball`` to a ``.partial`` file (resumed
with a Range request after an interruption), verify ``dist.integrity`` (SRI), extract only
``package/bin/opencode`` and move it atomically to ``cache_dir/<version>/<package>/opencode`` with a
``meta.json`` next to it.

All blocking work runs in one dedicated thread per (cache, registry, version, package): concurrent callers
share it, and it does not depend on any waiter or event loop, so cancelling every waiter lets it finish
(or fail) cleanly and the next caller finds the cached binary. Failures are not cached.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

# The pin and the registry are configuration facts (opencode_tui_core.config); the installer takes them as defaults.
from opencode_tui_core.config import DEFAULT_OPENCODE_VERSION, DEFAULT_REGISTRY_URL
from opencode_tui_core.json_text import indented_json
from opencode_tui_core.runtime.targets import Target

log = logging.getLogger(__name__)

InstallErrorKind = Literal[
    "install_failed", "install_integrity_mismatch", "install_timeout", "install_registry_unreachable"
]
ProgressCallback = Callable[[int, int | None], None]

BINARY_MEMBER = "package/bin/opencode"
BINARY_NAME = "opencode"
META_NAME = "meta.json"
# Far above the real sizes (60 MB tarball, 185 MB binary); a bound for a misbehaving server or archive.
_MAX_TARBALL_BYTES = 1 << 30
_MAX_BINARY_BYTES = 2 << 30
_PROGRESS_INTERVAL_S = 0.1
# Per-request ceilings; the whole install is additionally bounded by InstallerConfig.timeout_s.
_CONNECT_TIMEOUT_S = 30.0
_READ_TIMEOUT_S = 60.0
_SRI_STRENGTH = {"sha256": 1, "sha384": 2, "sha512": 3}
_VERSION_RE = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_USER_AGENT = "opencode-tui-installer/0.1"


class InstallError(Exception):
    """Installing OpenCode failed; ``kind`` is the failure kind, the message says what to do."""

    def __init__(
        self,
        kind: InstallErrorKind,
        message: str,
        *,
        package: str | None = None,
        version: str | None = None,
        url: str | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: InstallErrorKind = kind
        self.message = message
        self.package = package
        self.version = version
        self.url = url
        self.http_status = http_status


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/opencode-tui/opencode``, else ``~/.cache/opencode-tui/opencode``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "opencode-tui" / "opencode"


class InstallerConfig(BaseModel):
    """Which OpenCode to install, from where, into which cache, within what time budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = DEFAULT_OPENCODE_VERSION
    registry_url: str = DEFAULT_REGISTRY_URL
    cache_dir: Path = Field(default_factory=default_cache_dir)
    timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    # Attempts within one install when the tarball stream breaks; each retry resumes the .partial file.
    download_attempts: int = Field(default=3, ge=1, le=10)

    @field_validator("version")
    @classmethod
    def _version_shape(cls, value: str) -> str:
        # The version becomes a cache path component, so only plain semver is accepted.
        if not _VERSION_RE.fullmatch(value):
            raise ValueError(f"OpenCode version {value!r} must look like 1.18.32 (semver)")
        return value

    @field_validator("registry_url")
    @classmethod
    def _registry_shape(cls, value: str) -> str:
        url = httpx.URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"registry_url {value!r} must be an http(s) URL such as {DEFAULT_REGISTRY_URL}")
        return value.rstrip("/")

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()


class InstalledBinary(BaseModel):
    """A cached, verified OpenCode binary; ``downloaded`` is False for a cache hit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    version: str
    target: Target
    package: str
    sha256: str
    size: int
    integrity: str
    tarball_url: str
    downloaded: bool


def verify_version_command(path: str | os.PathLike[str]) -> list[str]:
    """The argv that prints the binary's version (run it on the host or in the sandbox)."""
    return [os.fspath(path), "--version"]


def check_version_output(text: str, pin: str) -> bool:
    """True when ``opencode --version`` output reports exactly ``pin`` (a leading ``v`` is tolerated)."""
    for token in re.findall(r"v?\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?", text):
        return token.removeprefix("v") == pin.removeprefix("v")
    return False


def _sri_digest(integrity: str) -> tuple[str, str]:
    """The strongest (algorithm, base64 digest) in an SRI string like ``sha512-AbC==``."""
    best: tuple[str, str] | None = None
    for item in integrity.split():
        algo, sep, digest = item.partition("-")
        digest = digest.split("?", 1)[0]  # SRI options are not used by npm, but are allowed
        if sep and algo in _SRI_STRENGTH and digest:
            if best is None or _SRI_STRENGTH[algo] > _SRI_STRENGTH[best[0]]:
                best = (algo, digest)
    if best is None:
        raise ValueError(f"no sha256/sha384/sha512 digest in integrity {integrity!r}")
    return best


def _version_key(version: str) -> tuple[int, int, int, int, str]:
    """Sort key for semver strings: releases after their pre-releases, unparsable ones first."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(-.+)?$", version)
    if not m:
        return (-1, 0, 0, 0, version)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if m.group(4) else 1, m.group(4) or "")


# Cache entries whose digest was checked, by the file's identity: a write changes its mtime and
# ctime, so a binary is hashed once per process until something touches it.
_VERIFIED: dict[tuple[str, int, int, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()
# Held while a binary is hashed: a second caller for the same file (``prewarm`` in a thread, then the
# install phase's ``cached``) waits for the first one's answer instead of hashing it again.
_HASHING_LOCK = threading.Lock()


def _digest_matches(binary: Path, st: os.stat_result, expected: str) -> bool:
    key = (str(binary), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _VERIFIED_LOCK:
        if _VERIFIED.get(key) == expected:
            return True
    with _HASHING_LOCK:
        with _VERIFIED_LOCK:
            if _VERIFIED.get(key) == expected:
                return True
        digest = hashlib.sha256()
        try:
            with binary.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            return False
        if digest.hexdigest() != expected:
            return False
        with _VERIFIED_LOCK:
            _VERIFIED[key] = expected
    return True


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    package: str
    version: str
    tarball: str
    integrity: str


class _Flight:
    """One in-flight install shared by its waiters; progress fans out to each waiter's event loop."""

    def __init__(self, key: tuple[str, ...], target: Target, deadline: float) -> None:
        self.key = key
        self.target = target
        self.deadline = deadline
        self.future: concurrent.futures.Future[InstalledBinary] = concurrent.futures.Future()
        self._lock = threading.Lock()
        self._subscribers: dict[int, tuple[asyncio.AbstractEventLoop, ProgressCallback]] = {}
        self._next_id = 0
        self._last: tuple[int, int | None] | None = None

    def subscribe(self, loop: asyncio.AbstractEventLoop, callback: ProgressCallback) -> int:
        with self._lock:
            self._next_id += 1
            sub_id = self._next_id
            self._subscribers[sub_id] = (loop, callback)
            last = self._last
        if last is not None:
            # A late joiner learns where the shared download stands right away.
            _post(loop, callback, *last)
        return sub_id

    def unsubscribe(self, sub_id: int | None) -> None:
        if sub_id is not None:
            with self._lock:
                self._subscribers.pop(sub_id, None)

    def publish(self, done: int, total: int | None) -> None:
        with self._lock:
            self._last = (done, total)
            subscribers = list(self._subscribers.values())
        for loop, callback in subscribers:
            _post(loop, callback, done, total)


def _post(loop: asyncio.AbstractEventLoop, callback: ProgressCallback, done: int, total: int | None) -> None:
    def call() -> None:
        try:
            callback(done, total)
        except Exception:  # a broken progress callback must not break the install or the loop
            log.exception("install progress callback failed")

    with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: nobody to tell
        loop.call_soon_threadsafe(call)


class Installer:
    """Installs the pinned OpenCode binary for a target into the controller's cache (see module doc)."""

    # Shared by all instances: two Installer objects over the same cache must still share one download.
    _flights: dict[tuple[str, ...], _Flight] = {}
    _flights_lock = threading.Lock()

    # Set when cached() found an entry whose bytes do not match its recorded digest (issue 19).
    corrupt: str | None = None

    def __init__(self, config: InstallerConfig | None = None) -> None:
        self.config = config or InstallerConfig()

    # -- paths -------------------------------------------------------------------------------------

    def entry_dir(self, target: Target) -> Path:
        return self.config.cache_dir / self.config.version / target.package_name

    def _partial_path(self, target: Target) -> Path:
        name = f"{target.package_name}-{self.config.version}.tgz.partial"
        return self.config.cache_dir / ".downloads" / name

    def _lock_path(self, target: Target) -> Path:
        return self.config.cache_dir / ".locks" / f"{target.package_name}-{self.config.version}.lock"

    def _key(self, target: Target) -> tuple[str, ...]:
        return (
            str(self.config.cache_dir.resolve()),
            self.config.registry_url,
            self.config.version,
            target.package_name,
        )

    # -- public API --------------------------------------------------------------------------------

    def share_for_mount(self, target: Target) -> None:
        """Make the path down to ``target``'s entry traversable by anyone (0755, whatever the umask
        made it): the cache is bind-mounted read-only into sandboxes whose user may not be ours, and
        a directory only its owner can enter would make every such sandbox upload the binary. The
        download and lock dirs stay private; nothing in the entries is secret."""
        root = self.config.cache_dir
        for d in (root, root / self.config.version, self.entry_dir(target)):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                if d.stat().st_mode & 0o777 != 0o755:
                    os.chmod(d, 0o755)

    def cached(self, target: Target) -> InstalledBinary | None:
        """The cached binary for ``target`` if a complete entry exists and its bytes still hash to the
        digest recorded when it was installed (hashed once per process while the file is unchanged).
        A corrupted entry is never handed out: ``corrupt`` says why, and an install replaces it."""
        entry = self.entry_dir(target)
        binary = entry / BINARY_NAME
        try:
            meta = json.loads((entry / META_NAME).read_text())
            st = binary.stat()
        except (OSError, ValueError):
            return None
        try:
            ok = (
                meta.get("version") == self.config.version
                and meta.get("package") == target.package_name
                and meta.get("size") == st.st_size
                and binary.is_file()
                and os.access(binary, os.X_OK)
            )
            if not ok:
                return None
            if not _digest_matches(binary, st, str(meta["sha256"])):
                self.corrupt = (
                    f"the cached OpenCode binary {binary} does not match the sha256 recorded at install "
                    f"({str(meta['sha256'])[:16]}…): it was not used and is fetched again"
                )
                log.warning("%s", self.corrupt)
                return None
            return InstalledBinary(
                path=binary,
                version=self.config.version,
                target=target,
                package=target.package_name,
                sha256=meta["sha256"],
                size=st.st_size,
                integrity=meta["integrity"],
                tarball_url=meta["tarball"],
                downloaded=False,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def prewarm(self) -> None:
        """Hash every complete cache entry of the pinned version now (``cached`` then answers from
        memory): run in a thread while the sandbox is created, the 185 MB digest of a fresh process
        (~0.17 CPU-s with SHA instructions, more without) is off the path to the install phase.
        Best effort: what it cannot read, ``cached`` reads again and judges."""
        try:
            entries = list((self.config.cache_dir / self.config.version).iterdir())
        except OSError:
            return
        for entry in entries:
            try:
                meta = json.loads((entry / META_NAME).read_text())
                binary = entry / BINARY_NAME
                _digest_matches(binary, binary.stat(), str(meta["sha256"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue

    def is_installing(self, target: Target) -> bool:
        with self._flights_lock:
            flight = self._flights.get(self._key(target))
        return flight is not None and not flight.future.done()

    async def ensure(self, target: Target, on_progress: ProgressCallback | None = None) -> InstalledBinary:
        """Return the cached binary for ``target``, installing it first if needed.

        ``on_progress(bytes_done, bytes_total_or_None)`` is called on the caller's event loop thread.
        Raises ``InstallError``. Cancelling this call does not cancel a shared install.
        """
        hit = self.cached(target)
        if hit is not None:
            return hit
        flight = self._join_or_start(target)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[InstalledBinary] = loop.create_future()

        def deliver(cf: concurrent.futures.Future[InstalledBinary]) -> None:
            def settle() -> None:
                if waiter.done():
                    return
                exc = cf.exception()
                if exc is not None:
                    waiter.set_exception(exc)
                else:
                    waiter.set_result(cf.result())

            with contextlib.suppress(RuntimeError):  # loop closed: the waiter is gone
                loop.call_soon_threadsafe(settle)

        sub_id = flight.subscribe(loop, on_progress) if on_progress is not None else None
        flight.future.add_done_callback(deliver)
        try:
            # Backstop: the worker enforces the deadline itself, but a blocking DNS lookup cannot be
            # interrupted, so waiters stop waiting at the deadline whatever the worker is doing.
            remaining = max(0.0, flight.deadline - time.monotonic()) + 0.5
            try:
                return await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                raise self._timeout_error(target, None, "still running") from None
        finally:
            flight.unsubscribe(sub_id)

    # -- flight management -------------------------------------------------------------------------

    def _join_or_start(self, target: Target) -> _Flight:
        key = self._key(target)
        with self._flights_lock:
            flight = self._flights.get(key)
            if flight is not None and not flight.future.done():
                return flight
            flight = _Flight(key, target, time.monotonic() + self.config.timeout_s)
            self._flights[key] = flight
        # A daemon thread of its own (not a loop's executor): it outlives cancelled waiters and closed loops,
        # and never holds up interpreter exit (the cache entry is only ever renamed into place, whole).
        name = f"opencode-install-{target.package_name}"
        thread = threading.Thread(target=self._run_flight, args=(flight,), name=name, daemon=True)
        thread.start()
        return flight

    def _run_flight(self, flight: _Flight) -> None:
        flight.future.set_running_or_notify_cancel()
        try:
            result = self._install_sync(flight)
        except BaseException as exc:
            error = exc if isinstance(exc, InstallError) else self._unexpected(flight.target, exc)
            self._forget(flight)
            flight.future.set_exception(error)
        else:
            self._forget(flight)
            flight.future.set_result(result)

    def _unexpected(self, target: Target, exc: BaseException) -> InstallError:
        where = f"OpenCode {self.config.version} ({target.package_name})"
        if isinstance(exc, OSError):
            message = (
                f"Installing {where} failed on the local file system: {exc}. Make sure the cache directory "
                f"{self.config.cache_dir} is writable and has about 300 MB free (or configure another "
                "cache_dir), then retry."
            )
        else:
            log.error("unexpected error while installing %s", where, exc_info=exc)
            message = (
                f"Installing {where} failed unexpectedly: {type(exc).__name__}: {exc}. Retry; if it "
                f"persists, clear {self.config.cache_dir} and report the problem."
            )
        error = InstallError(
            "install_failed", message, package=target.package_name, version=self.config.version
        )
        error.__cause__ = exc
        return error

    def _forget(self, flight: _Flight) -> None:
        # Removed before the future settles so a caller woken by a failure starts a fresh install.
        with self._flights_lock:
            if self._flights.get(flight.key) is flight:
                del self._flights[flight.key]

    # -- the install (worker thread) ---------------------------------------------------------------

    def _install_sync(self, flight: _Flight) -> InstalledBinary:
        target = flight.target
        self._mkdirs()
        with self._file_lock(target, flight.deadline):
            # Another process (or an earlier flight) may have finished while we waited for the lock.
            hit = self.cached(target)
            if hit is not None:
                return hit
            with httpx.Client(
                follow_redirects=True,
                headers={"user-agent": _USER_AGENT, "accept-encoding": "identity"},
            ) as client:
                meta = self._fetch_metadata(client, target, flight.deadline)
                tarball = self._download(client, meta, flight)
            sidecar = tarball.with_name(tarball.name + ".json")
            try:
                result = self._commit(tarball, meta, target)
            except InstallError:
                # A verified but unusable package: keeping it would only make a retry fail the same way.
                tarball.unlink(missing_ok=True)
                sidecar.unlink(missing_ok=True)
                raise
            # Only after the entry is in place: a crash before this keeps the .partial for a resume.
            tarball.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            return result

    def _mkdirs(self) -> None:
        root = self.config.cache_dir
        for d in (root, root / ".downloads", root / ".locks"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _file_lock(self, target: Target, deadline: float) -> Iterator[None]:
        """Serialize installs of one entry across processes sharing the cache (the .partial is shared)."""
        fd = os.open(self._lock_path(target), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                if time.monotonic() >= deadline:
                    raise self._timeout_error(target, None, "waiting for another process installing it")
                time.sleep(0.1)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _timeout_error(self, target: Target, url: str | None, doing: str) -> InstallError:
        return InstallError(
            "install_timeout",
            f"Installing OpenCode {self.config.version} ({target.package_name}) did not finish within "
            f"{self.config.timeout_s:g} s ({doing}). Retry (a partial download is resumed), raise the "
            "installer timeout, or use a closer registry mirror (registry_url).",
            package=target.package_name,
            version=self.config.version,
            url=url,
        )

    def _timeouts(self, deadline: float, target: Target, url: str, doing: str) -> httpx.Timeout:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout_error(target, url, doing)
        return httpx.Timeout(min(_READ_TIMEOUT_S, remaining), connect=min(_CONNECT_TIMEOUT_S, remaining))

    def _failed(
        self, target: Target, message: str, *, url: str | None = None, status: int | None = None
    ) -> InstallError:
        return InstallError(
            "install_failed",
            message,
            package=target.package_name,
            version=self.config.version,
            url=url,
            http_status=status,
        )

    def _transport_error(
        self, target: Target, url: str, exc: httpx.HTTPError, deadline: float, doing: str
    ) -> InstallError:
        if time.monotonic() >= deadline:
            err = self._timeout_error(target, url, doing)
        else:
            # The registry could not be reached or stopped answering (refused, DNS, reset, a read
            # that timed out): a condition of the network, so its own kind, which the policy retries.
            err = InstallError(
                "install_registry_unreachable",
                f"Could not {doing} from {url}: {type(exc).__name__}: {str(exc) or 'no detail'}. Check the "
                "network or proxy settings, or set registry_url to a reachable mirror, then retry.",
                package=target.package_name,
                version=self.config.version,
                url=url,
            )
        err.__cause__ = exc
        return err

    def _fetch_metadata(self, client: httpx.Client, target: Target, deadline: float) -> _Metadata:
        package, version = target.package_name, self.config.version
        url = f"{self.config.registry_url}/{package}/{version}"
        try:
            resp = client.get(
                url,
                headers={"accept": "application/json"},
                timeout=self._timeouts(deadline, target, url, "fetching package metadata"),
            )
        except httpx.HTTPError as exc:
            raise self._transport_error(target, url, exc, deadline, "fetch package metadata") from exc
        if resp.status_code == 404:
            hint = self._available_versions_hint(client, target, deadline)
            raise self._failed(
                target,
                f"The registry {self.config.registry_url} has no {package}@{version} "
                f"(HTTP 404 for {url}).{hint} Use a sandbox platform this OpenCode version is published "
                "for, pin a version the registry has for this platform, or point registry_url at a mirror "
                "that serves it.",
                url=url,
                status=404,
            )
        if resp.status_code != 200:
            raise self._failed(
                target,
                f"The registry answered HTTP {resp.status_code} for {url}. Retry later, or set registry_url "
                "to a working mirror.",
                url=url,
                status=resp.status_code,
            )
        try:
            doc = resp.json()
            dist = doc["dist"]
            meta = _Metadata(
                package=doc.get("name", package),
                version=doc.get("version", version),
                tarball=dist["tarball"],
                integrity=dist["integrity"],
            )
            _sri_digest(meta.integrity)
        except (ValueError, KeyError, TypeError) as exc:
            raise self._failed(
                target,
                f"The registry's metadata at {url} is unusable ({exc}): it needs dist.tarball and a sha512 "
                "dist.integrity. Check that registry_url points at an npm registry.",
                url=url,
            ) from exc
        if meta.package != package or meta.version != version:
            raise self._failed(
                target,
                f"The registry's metadata at {url} describes {meta.package}@{meta.version}, not "
                f"{package}@{version}. Check that registry_url points at an npm registry.",
                url=url,
            )
        if httpx.URL(meta.tarball).scheme not in ("http", "https"):
            raise self._failed(target, f"The tarball URL {meta.tarball!r} in {url} is not http(s).", url=url)
        return meta

    def _available_versions_hint(self, client: httpx.Client, target: Target, deadline: float) -> str:
        """Best effort: name the newest versions the registry has for this package (one request)."""
        url = f"{self.config.registry_url}/{target.package_name}"
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 1:
                return ""
            resp = client.get(
                url, headers={"accept": "application/vnd.npm.install-v1+json"}, timeout=min(15.0, remaining)
            )
            if resp.status_code == 404:
                return f" The registry has no {target.package_name} package at all."
            versions = list(resp.json().get("versions", {})) if resp.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return ""
        if not versions:
            return ""
        newest = sorted(versions, key=_version_key)[-5:]
        return f" Versions it has for {target.package_name} (newest): {', '.join(newest)}."

    # -- download ----------------------------------------------------------------------------------

    def _download(self, client: httpx.Client, meta: _Metadata, flight: _Flight) -> Path:
        """Download the tarball into the .partial file, resuming if possible; return it once verified."""
        target, deadline = flight.target, flight.deadline
        partial = self._partial_path(target)
        sidecar = partial.with_name(partial.name + ".json")
        ident = {"tarball": meta.tarball, "integrity": meta.integrity}
        # A .partial is only resumed if it belongs to the same tarball and digest.
        try:
            same = json.loads(sidecar.read_text()) == ident
        except (OSError, ValueError):
            same = False
        if not same:
            partial.unlink(missing_ok=True)
            sidecar.write_text(json.dumps(ident))

        attempts_left = self.config.download_attempts
        resumed = False
        while True:
            attempts_left -= 1
            start = partial.stat().st_size if partial.exists() else 0
            try:
                complete, was_resume = self._fetch_into(client, meta, flight, partial, start)
            except _StreamBroken as broken:
                # Keep the .partial: the next attempt (here or by the next caller) resumes from it.
                if attempts_left > 0 and broken.progressed:
                    log.info("tarball stream broke (%s); resuming", broken.cause)
                    continue
                raise self._transport_error(
                    target, meta.tarball, broken.cause, deadline, "download the package tarball"
                ) from broken.cause
            resumed = resumed or was_resume
            if not complete:
                continue  # the server would not resume; the .partial was reset, download from scratch
            got = self._digest_file(partial, meta.integrity)
            expected = _sri_digest(meta.integrity)
            if got == expected[1]:
                return partial
            partial.unlink(missing_ok=True)
            if resumed and attempts_left > 0:
                # The kept prefix may have been the corrupt part; one clean download decides.
                log.warning("integrity mismatch after a resumed download; downloading from scratch")
                resumed = False
                continue
            sidecar.unlink(missing_ok=True)
            raise InstallError(
                "install_integrity_mismatch",
                f"The download of {target.package_name}@{self.config.version} from {meta.tarball} does not "
                f"match the registry's digest: expected {expected[0]}-{expected[1]}, got "
                f"{expected[0]}-{got}. The file was discarded. Retry; if it persists, the registry or "
                "mirror (registry_url) serves a different file than it published, so use another one.",
                package=target.package_name,
                version=self.config.version,
                url=meta.tarball,
            )

    def _fetch_into(
        self, client: httpx.Client, meta: _Metadata, flight: _Flight, partial: Path, start: int
    ) -> tuple[bool, bool]:
        """One GET of the tarball, appending from ``start``; returns (complete, resumed).

        ``complete`` is False when a resume was refused in a way that needs a fresh request (the .partial
        is then emptied). A broken stream raises ``_StreamBroken`` and keeps what arrived.
        """
        target, deadline, url = flight.target, flight.deadline, meta.tarball
        headers = {"range": f"bytes={start}-"} if start else {}
        timeout = self._timeouts(deadline, target, url, "downloading the package tarball")
        done = start
        written = [0]  # bytes this attempt wrote, also when a 200 restarted the file
        try:
            with client.stream("GET", url, headers=headers, timeout=timeout) as resp:
                total: int | None
                if start and resp.status_code == 206:
                    m = _CONTENT_RANGE_RE.fullmatch(resp.headers.get("content-range", "").strip())
                    if (
                        not m
                        or int(m.group(1)) != start
                        or (m.group(3) != "*" and int(m.group(2)) != int(m.group(3)) - 1)
                    ):
                        log.info("resume refused (Content-Range %r); restarting", m and m.group(0))
                        partial.unlink(missing_ok=True)
                        return False, False
                    total = None if m.group(3) == "*" else int(m.group(3))
                    mode, resumed = "ab", True
                elif start and resp.status_code == 416:
                    m = re.fullmatch(r"bytes \*/(\d+)", resp.headers.get("content-range", "").strip())
                    if m and int(m.group(1)) == start:
                        flight.publish(start, start)
                        return True, True  # the .partial was already complete (crash before commit)
                    partial.unlink(missing_ok=True)
                    return False, False
                elif resp.status_code == 200:
                    # A server that ignores Range sends the whole file again: start over cleanly.
                    length = resp.headers.get("content-length")
                    total = int(length) if length and length.isdigit() else None
                    mode, resumed, done = "wb", False, 0
                else:
                    raise self._failed(
                        target,
                        f"Downloading {url} failed with HTTP {resp.status_code}. Retry later, or set "
                        "registry_url to a working mirror.",
                        url=url,
                        status=resp.status_code,
                    )
                if total is not None and total > _MAX_TARBALL_BYTES:
                    raise self._failed(
                        target, f"The tarball at {url} claims {total} bytes; refused.", url=url
                    )
                return self._stream_body(resp, flight, partial, mode, done, total, written), resumed
        except httpx.HTTPError as exc:
            raise _StreamBroken(exc, progressed=written[0] > 0) from exc

    def _stream_body(
        self,
        resp: httpx.Response,
        flight: _Flight,
        partial: Path,
        mode: str,
        done: int,
        total: int | None,
        written: list[int],
    ) -> bool:
        target, url = flight.target, str(resp.request.url)
        last_report = 0.0
        flight.publish(done, total)
        with open(partial, mode) as f:
            # No chunk_size: httpx would buffer up to it and lose the buffer when the stream breaks.
            for chunk in resp.iter_bytes():
                f.write(chunk)
                done += len(chunk)
                written[0] += len(chunk)
                if done > _MAX_TARBALL_BYTES:
                    f.close()
                    partial.unlink(missing_ok=True)
                    too_big = f"The tarball at {url} exceeds {_MAX_TARBALL_BYTES} bytes; refused."
                    raise self._failed(target, too_big, url=url)
                now = time.monotonic()
                if now - last_report >= _PROGRESS_INTERVAL_S:
                    last_report = now
                    flight.publish(done, total)
                if now >= flight.deadline:
                    f.flush()
                    raise self._timeout_error(target, url, f"downloaded {done} of {total or '?'} bytes")
        flight.publish(done, total)
        return True

    @staticmethod
    def _digest_file(path: Path, integrity: str) -> str:
        algo, _ = _sri_digest(integrity)
        h = hashlib.new(algo)
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return base64.b64encode(h.digest()).decode()

    # -- extract and commit ------------------------------------------------------------------------

    def _commit(self, tarball: Path, meta: _Metadata, target: Target) -> InstalledBinary:
        version_dir = self.config.cache_dir / self.config.version
        version_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = self.entry_dir(target)
        # Leftovers of a crashed install of this entry (we hold its lock, so none is live).
        for stale in version_dir.glob(f".{target.package_name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.package_name}.", suffix=".tmp", dir=version_dir))
        try:
            binary = tmp / BINARY_NAME
            sha256, size = self._extract_binary(tarball, binary, target, meta.tarball)
            os.chmod(binary, 0o755)
            record: dict[str, Any] = {
                "package": target.package_name,
                "version": self.config.version,
                "target": target.model_dump(),
                "sha256": sha256,
                "size": size,
                "integrity": meta.integrity,
                "tarball": meta.tarball,
                "installed_at": datetime.now(UTC).isoformat(),
            }
            (tmp / META_NAME).write_text(indented_json(record) + "\n")
            os.chmod(tmp, 0o755)
            if entry.exists():
                # Incomplete or stale (cached() rejected it): move it aside first so the rename is atomic.
                aside = tempfile.mkdtemp(prefix=f".{target.package_name}.", suffix=".tmp", dir=version_dir)
                os.rename(entry, Path(aside) / "old")
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for stale in version_dir.glob(f".{target.package_name}.*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
        return InstalledBinary(
            path=entry / BINARY_NAME,
            version=self.config.version,
            target=target,
            package=target.package_name,
            sha256=sha256,
            size=size,
            integrity=meta.integrity,
            tarball_url=meta.tarball,
            downloaded=True,
        )

    def _extract_binary(self, tarball: Path, dest: Path, target: Target, url: str) -> tuple[str, int]:
        """Copy ``package/bin/opencode`` out of the tarball; refuse links, devices, odd paths, duplicates."""

        def bad(why: str) -> InstallError:
            return self._failed(
                target,
                f"The package tarball {url} is not a usable OpenCode package: {why}. Nothing was installed; "
                "check that registry_url serves genuine npm packages.",
                url=url,
            )

        try:
            with tarfile.open(tarball, mode="r:gz") as tf:
                found: tarfile.TarInfo | None = None
                for member in tf:
                    name = PurePosixPath(member.name)
                    outside = name.is_absolute() or ".." in name.parts or not name.parts
                    if outside or name.parts[0] != "package":
                        raise bad(f"member {member.name!r} is outside package/")
                    if not (member.isreg() or member.isdir()):
                        raise bad(f"member {member.name!r} is a link, device or other special file")
                    if name == PurePosixPath(BINARY_MEMBER):
                        if found is not None or not member.isreg():
                            raise bad(f"{BINARY_MEMBER} appears twice or is not a regular file")
                        if member.size <= 0 or member.size > _MAX_BINARY_BYTES:
                            raise bad(f"{BINARY_MEMBER} has an implausible size ({member.size} bytes)")
                        found = member
                        sha256, size = self._copy_member(tf, member, dest)
                if found is None:
                    raise bad(f"it has no {BINARY_MEMBER}")
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise bad(f"it is not a readable gzip tar archive ({exc})") from exc
        except OSError as exc:
            if exc.errno is None:  # gzip.BadGzipFile and friends: a bad archive, not a local problem
                raise bad(f"it is not a readable gzip tar archive ({exc})") from exc
            raise self._failed(
                target,
                f"Writing the OpenCode binary to {dest} failed: {exc}. Check free space and permissions of "
                f"{self.config.cache_dir}.",
                url=url,
            ) from exc
        return sha256, size

    @staticmethod
    def _copy_member(tf: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> tuple[str, int]:
        src = tf.extractfile(member)
        if src is None:
            raise tarfile.TarError(f"cannot read {member.name}")
        h = hashlib.sha256()
        size = 0
        with src, open(dest, "xb") as out:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
                size += len(block)
            out.flush()
            os.fsync(out.fileno())
        if size != member.size:
            raise tarfile.TarError(f"{member.name} is truncated ({size} of {member.size} bytes)")
        return h.hexdigest(), size


class _StreamBroken(Exception):
    """The tarball stream failed mid-way; ``progressed`` says whether this attempt wrote any bytes."""

    def __init__(self, cause: httpx.HTTPError, *, progressed: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.progressed = progressed
