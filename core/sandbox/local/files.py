"""fd-pinned file transfer between the host and a local sandbox's binds (never following a symlink).

See "Files" in core/sandbox/local/provider.py's docstring.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox.errors import SandboxError, UnsafeArchiveError
from opencode_tui_core.sandbox.local.common import _error
from opencode_tui_core.sandbox.local.disk import _unmount_disk

# ---------------------------------------------------------------------------------------------
# fd-pinned file transfer (see "Files" in the module docstring)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(parent_fd: int, name: str, *, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


class _SymlinkInTheWay(Exception):
    def __init__(self, component: str):
        super().__init__(component)
        self.component = component


def _walk(root_fd: int, parts: Sequence[str], *, create: bool) -> int:
    """Open ``parts`` below ``root_fd`` one component at a time, never following a symlink.

    Raises ``_SymlinkInTheWay`` when a component is a symlink (or not a directory).
    """
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = _open_dir(fd, part, create=create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _SymlinkInTheWay(part) from exc
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk_existing(root_fd: int, parts: Sequence[str]) -> str | None:
    """The first component of ``parts`` that is a symlink or non-directory on disk (None if none)."""
    try:
        os.close(_walk(root_fd, parts, create=False))
    except _SymlinkInTheWay as exc:
        return exc.component
    except FileNotFoundError:
        pass  # the rest will be created
    return None


def _dest_error(shown: str, component: str) -> SandboxError:
    return _error(
        "sandbox_file_failed",
        "upload",
        f"{shown}: path component {component!r} is a symlink or not a directory; the local provider does not "
        "follow links on the host",
        stage=FailureStage.AGENT,
    )


def _member_error(name: str, component: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"archive member {name!r} goes through {component!r}, {why}; refused")


def _preflight(dest_fd: int | None, members: Sequence[tarfile.TarInfo]) -> None:
    """Refuse, before anything is written, members that would pass through a symlink: one from the
    archive itself (``a -> .`` then ``a/b``) or one already on disk. (A symlink planted on disk
    *during* the extraction is caught by the O_NOFOLLOW walk, at that member.)"""
    links = {_member_parts(m.name) for m in members if m.issym()}
    for m in members:
        paths = [_member_parts(m.name)]
        if m.islnk():
            paths.append(_member_parts(m.linkname))
        for parts in paths:
            for i in range(1, len(parts)):
                if parts[:i] in links:
                    raise _member_error(m.name, "/".join(parts[:i]), "a symlink in the same archive")
            if dest_fd is not None and (bad := _walk_existing(dest_fd, parts[:-1])) is not None:
                raise _member_error(m.name, bad, "a symlink (or non-directory) already in the target")


def _remove_nondir(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeArchiveError(f"archive member would replace the directory {name!r} with a non-directory")
    os.unlink(name, dir_fd=dir_fd)


def _member_parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in PurePosixPath(name).parts if p not in ("", "."))


def _safe_mode(mode: int) -> int:
    # As tarfile's "tar" filter: no setuid/setgid/sticky, no group/other write.
    return mode & 0o777 & ~0o022


def _extract_pinned(root: Path, rel: Sequence[str], archive: bytes, shown: str) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
        members = tf.getmembers()
        root_fd = os.open(root, _DIR_FLAGS)
        try:
            bad = _walk_existing(root_fd, rel)
            if bad is not None:
                raise _dest_error(shown, bad)
            try:
                existing: int | None = _walk(root_fd, rel, create=False)
            except FileNotFoundError:
                existing = None
            try:
                _preflight(existing, members)
            finally:
                if existing is not None:
                    os.close(existing)
            try:
                dest_fd = _walk(root_fd, rel, create=True)
            except _SymlinkInTheWay as exc:
                raise _dest_error(shown, exc.component) from exc
        finally:
            os.close(root_fd)
        try:
            _extract_members(tf, members, dest_fd)
        finally:
            os.close(dest_fd)


def _extract_members(tf: tarfile.TarFile, members: Sequence[tarfile.TarInfo], dest_fd: int) -> None:
    dir_modes: list[tuple[tuple[str, ...], int, float]] = []
    for m in members:
        parts = _member_parts(m.name)
        if not parts:
            if m.isdir():
                dir_modes.append(((), m.mode, m.mtime))
            continue
        try:
            parent = _walk(dest_fd, parts[:-1], create=True)
        except _SymlinkInTheWay as exc:
            raise _member_error(m.name, exc.component, "a symlink (or non-directory) in the target") from exc
        name = parts[-1]
        try:
            if m.isdir():
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        os.unlink(name, dir_fd=parent)
                        os.mkdir(name, 0o755, dir_fd=parent)
                except FileNotFoundError:
                    os.mkdir(name, 0o755, dir_fd=parent)
                dir_modes.append((parts, m.mode, m.mtime))
            elif m.isfile():
                _remove_nondir(parent, name)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(name, flags, 0o600, dir_fd=parent)
                try:
                    src = tf.extractfile(m)
                    assert src is not None
                    while chunk := src.read(1 << 20):
                        os.write(fd, chunk)
                    os.fchmod(fd, _safe_mode(m.mode))
                    os.utime(fd, (m.mtime, m.mtime))
                finally:
                    os.close(fd)
            elif m.issym():
                _remove_nondir(parent, name)
                os.symlink(m.linkname, name, dir_fd=parent)
            elif m.islnk():
                src_parts = _member_parts(m.linkname)
                try:
                    src_parent = _walk(dest_fd, src_parts[:-1], create=False)
                except _SymlinkInTheWay as exc:
                    raise _member_error(m.name, exc.component, "a symlink in the target") from exc
                try:
                    _remove_nondir(parent, name)
                    os.link(
                        src_parts[-1], name, src_dir_fd=src_parent, dst_dir_fd=parent, follow_symlinks=False
                    )
                finally:
                    os.close(src_parent)
        finally:
            os.close(parent)
    # Directory modes last (a read-only directory must not block its own members), deepest first.
    for parts, mode, mtime in sorted(dir_modes, key=lambda x: len(x[0]), reverse=True):
        try:
            fd = _walk(dest_fd, parts, create=False)
        except (_SymlinkInTheWay, FileNotFoundError):
            continue  # changed under us by the sandbox: nothing to set
        try:
            os.fchmod(fd, _safe_mode(mode) | 0o700)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def _tarinfo(arcname: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    return info


def _add_entry(tf: tarfile.TarFile, arcname: str, parent_fd: int, name: str) -> None:
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        info = _tarinfo(arcname, st)
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(name, dir_fd=parent_fd)
        tf.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        with os.fdopen(fd, "rb") as fobj:
            fst = os.fstat(fobj.fileno())
            info = _tarinfo(arcname, fst)
            info.size = fst.st_size
            tf.addfile(info, fobj)
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            info = _tarinfo(arcname, os.fstat(fd))
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
            for child in sorted(os.listdir(fd)):
                _add_entry(tf, f"{arcname}/{child}", fd, child)
        finally:
            os.close(fd)
    # sockets, fifos and devices are skipped


def _archive_pinned(root: Path, rel: Sequence[str], arcname: str, shown: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        if not rel:  # the bind itself (a directory, or a single bound file)
            parent_fd = os.open(root.parent, _DIR_FLAGS)
            try:
                _add_entry(tf, arcname, parent_fd, root.name)
            finally:
                os.close(parent_fd)
        else:
            root_fd = os.open(root, _DIR_FLAGS)
            try:
                parent_fd = _walk(root_fd, rel[:-1], create=False)
            except _SymlinkInTheWay as exc:
                raise _error(
                    "sandbox_file_failed",
                    "download",
                    f"{shown}: path component {exc.component!r} is a symlink or not a directory; the local "
                    "provider does not follow links on the host",
                    stage=FailureStage.AGENT,
                ) from exc
            finally:
                os.close(root_fd)
            try:
                _add_entry(tf, arcname, parent_fd, rel[-1])
            finally:
                os.close(parent_fd)
    return buf.getvalue()


def _rmtree(path: Path) -> None:
    _unmount_disk(path)  # a sized filesystem (limits.disk) is unmounted first, never emptied in place

    def onerror(func: Any, p: str, exc_info: Any) -> None:
        # A directory made read-only inside the sandbox: make it writable and retry once.
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)
