"""Tar handling that refuses members which could escape their target directory."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath

from opencode_tui_core.sandbox.errors import UnsafeArchiveError


def _check_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute():
        raise UnsafeArchiveError(
            f"archive member {name!r} has an absolute path; only relative paths are allowed"
        )
    if ".." in p.parts:
        raise UnsafeArchiveError(f"archive member {name!r} contains '..'; it could write outside the target")
    return p


def check_archive(archive: bytes) -> list[tarfile.TarInfo]:
    """Validate every member; raise UnsafeArchiveError naming the first bad one. Returns the members."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
            members = tf.getmembers()
    except tarfile.TarError as exc:
        raise UnsafeArchiveError(f"not a readable tar archive: {exc}") from exc
    for m in members:
        p = _check_name(m.name)
        if m.isdev() or m.isfifo():
            raise UnsafeArchiveError(f"archive member {m.name!r} is a device or fifo; refused")
        if m.issym():
            target = PurePosixPath(m.linkname)
            resolved = target if target.is_absolute() else (p.parent / target)
            if target.is_absolute() or _escapes(resolved):
                raise UnsafeArchiveError(
                    f"archive member {m.name!r} is a symlink to {m.linkname!r}, outside the target; refused"
                )
        if m.islnk():
            _check_name(m.linkname)
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise UnsafeArchiveError(f"archive member {m.name!r} has an unsupported type; refused")
    _check_no_path_through_symlink(members)
    return members


# setuid, setgid, sticky: never carried into a sandbox by an upload, on any provider. A setuid file
# placed by the engine (as root) would let an unprivileged sandbox user run it as its owner.
SPECIAL_BITS = 0o7000


def without_special_bits(archive: bytes) -> bytes:
    """The archive with setuid/setgid/sticky cleared on every member (unchanged when none has them).
    For providers whose extractor keeps the archive's modes (Docker's ``put_archive``, tar as root)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
        if not any(m.mode & SPECIAL_BITS for m in tf.getmembers()):
            return archive
    src = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*")
    buf = io.BytesIO()
    with src, tarfile.open(fileobj=buf, mode="w") as dst:
        for m in src.getmembers():
            m.mode &= ~SPECIAL_BITS
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return buf.getvalue()


def _check_no_path_through_symlink(members: list[tarfile.TarInfo]) -> None:
    """Refuse members placed *through* a symlink of the same archive.

    Each link is checked lexically above, but links can chain: ``a -> .`` then ``a/b -> ..`` each
    stay inside on their own, yet ``a/b/x`` lands outside the target. No member path (and no
    hard-link target) may pass through a directory that the archive itself declares as a symlink.
    """
    links = {PurePosixPath(m.name).parts for m in members if m.issym()}
    if not links:
        return
    for m in members:
        names = [m.name, m.linkname] if m.islnk() else [m.name]
        for name in names:
            parts = PurePosixPath(name).parts
            for i in range(1, len(parts)):
                if parts[:i] in links:
                    raise UnsafeArchiveError(
                        f"archive member {m.name!r} is placed through the archive's own symlink "
                        f"{'/'.join(parts[:i])!r}; refused"
                    )


def _escapes(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def safe_extract(archive: bytes, dest: Path) -> None:
    """Extract into ``dest`` on this host after validation; also refuses writing through existing links."""
    check_archive(archive)
    dest = dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
        for m in tf.getmembers():
            target = (dest / m.name).resolve() if not m.issym() else (dest / m.name).parent.resolve()
            if target != dest and dest not in target.parents:
                raise UnsafeArchiveError(f"archive member {m.name!r} resolves outside {dest}; refused")
        tf.extractall(dest, filter="tar")


def single_file_tar(name: str, data: bytes, mode: int = 0o644, owner: tuple[int, int] | None = None) -> bytes:
    return tree_tar({name: (data, mode)}, owner=owner)


def _owned(info: tarfile.TarInfo, owner: tuple[int, int] | None) -> tarfile.TarInfo:
    # Numeric ids only: an empty name makes extractors use the number, not a lookup by name.
    if owner is not None:
        info.uid, info.gid = owner
        info.uname = info.gname = ""
    return info


def tree_tar(
    entries: dict[str, tuple[bytes | None, int]],
    *,
    owner: tuple[int, int] | None = None,
    root_mode: int | None = None,
) -> bytes:
    """A tar of relative paths → ``(content, mode)``; ``None`` content makes a directory.

    Parent directories are added as needed, so one upload can lay out a whole tree. Modes are the
    given ones (never the controller's umask); ``owner`` (uid, gid) is written into every header;
    ``root_mode`` adds a ``.`` entry: the target directory itself gets that mode and owner.
    """
    buf = io.BytesIO()
    added: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        if root_mode is not None:
            info = tarfile.TarInfo(".")
            info.type = tarfile.DIRTYPE
            info.mode = root_mode
            tf.addfile(_owned(info, owner))
        for name, (data, mode) in entries.items():
            parts = PurePosixPath(name).parts
            for i in range(1, len(parts) + (1 if data is None else 0)):
                parent = "/".join(parts[:i])
                if parent not in added:
                    added.add(parent)
                    info = tarfile.TarInfo(parent)
                    info.type = tarfile.DIRTYPE
                    info.mode = mode if data is None and i == len(parts) else 0o755
                    tf.addfile(_owned(info, owner))
            if data is not None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = mode
                tf.addfile(_owned(info, owner), io.BytesIO(data))
    return buf.getvalue()


def directory_tar(
    src: Path,
    arcname: str = ".",
    *,
    owner: tuple[int, int] | None = None,
    root_mode: int | None = None,
) -> bytes:
    """Tar a host directory (links kept as links; they are validated again on upload).

    Modes are the host files' own (a deliberately unreadable file stays unreadable); ``owner``
    (uid, gid) replaces the host's ids in every header; ``root_mode`` adds the ``.`` entry.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        if root_mode is not None:
            info = tarfile.TarInfo(arcname)
            info.type = tarfile.DIRTYPE
            info.mode = root_mode
            tf.addfile(_owned(info, owner))
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                full = Path(root) / name
                rel = full.relative_to(src)
                tf.add(
                    full,
                    arcname=str(PurePosixPath(arcname) / rel),
                    recursive=False,
                    filter=lambda info: _owned(info, owner),
                )
    return buf.getvalue()


def reroot(archive: bytes, top: str) -> bytes:
    """The same archive with every member moved under ``top/`` (``.`` becomes ``top`` itself).

    For providers whose extractor skips a ``.`` entry for an existing target (Docker's): uploading
    the rerooted archive into the target's parent applies the ``.`` entry's owner and mode.
    """
    _check_name(top)
    src = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*")
    buf = io.BytesIO()
    with src, tarfile.open(fileobj=buf, mode="w") as dst:
        for m in src.getmembers():
            rel = PurePosixPath(m.name)
            m.name = top if str(rel) == "." else str(PurePosixPath(top) / rel)
            if m.islnk():
                m.linkname = str(PurePosixPath(top) / m.linkname)
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return buf.getvalue()


def read_single_file(archive: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
        for m in tf.getmembers():
            if m.isfile() and PurePosixPath(m.name).name == name:
                f = tf.extractfile(m)
                assert f is not None
                return f.read()
    raise FileNotFoundError(f"{name!r} is not a regular file in the downloaded archive")
