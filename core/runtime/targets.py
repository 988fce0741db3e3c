"""Which OpenCode platform package fits a sandbox: probe the sandbox, parse the facts, pick a target.

The probe is a POSIX ``sh`` script run inside the sandbox; it prints ``key=value`` lines between a start
and an end marker so that truncated or interleaved output is detected instead of being read as "absent".
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

Arch = Literal["x64", "arm64"]
Libc = Literal["glibc", "musl"]

PROBE_START = "opencode_tui_probe=1"
PROBE_END = "opencode_tui_probe_end=1"

# `uname -m` spellings of the two architectures OpenCode publishes Linux binaries for.
_ARCH_ALIASES: dict[str, Arch] = {
    "x86_64": "x64",
    "amd64": "x64",
    "x64": "x64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "aarch64_be": "arm64",
    "armv8l": "arm64",
    "armv8b": "arm64",
}


class UnsupportedTargetError(ValueError):
    """The sandbox's platform has no OpenCode build (e.g. an unknown CPU architecture)."""


class ProbeError(ValueError):
    """The probe output is missing, truncated or malformed."""


class Target(BaseModel):
    """One OpenCode platform build: OS, CPU architecture, C library and AVX2 (``baseline`` = no AVX2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    os: Literal["linux"] = "linux"
    arch: Arch
    libc: Libc = "glibc"
    baseline: bool = False

    @model_validator(mode="after")
    def _baseline_is_x64_only(self) -> Target:
        # The baseline builds exist because of AVX2, an x86 extension; there is no arm64 baseline package.
        if self.baseline and self.arch != "x64":
            raise ValueError(f"baseline builds exist only for x64, not {self.arch}")
        return self

    @property
    def suffix(self) -> str:
        """``linux-x64-baseline-musl`` and friends: the package name without ``opencode-``."""
        parts: list[str] = [self.os, self.arch]
        if self.baseline:
            parts.append("baseline")
        if self.libc == "musl":
            parts.append("musl")
        return "-".join(parts)

    @property
    def package_name(self) -> str:
        """The npm package that carries this build's binary, e.g. ``opencode-linux-x64-baseline-musl``."""
        return f"opencode-{self.suffix}"


class SandboxFacts(BaseModel):
    """What the probe found in a sandbox. ``None`` means "not found" (or unknown, for ``avx2``/``uid``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    os: str | None = None
    machine: str
    musl_loader: str | None = None
    glibc_loader: str | None = None
    ldd_version: str | None = None
    gnu_libc_version: str | None = None
    avx2: bool | None = None
    python3: str | None = None
    python3_version: str | None = None
    rg: str | None = None
    sh: str | None = None
    bash: str | None = None
    uid: int | None = None
    apt_get: str | None = None
    apk: str | None = None

    @property
    def libc(self) -> Libc:
        """The C library the sandbox's programs use, from the strongest evidence available.

        ``ldd --version`` names the system libc, so it wins: a Debian host with the ``musl`` package has a
        musl loader but is a glibc system, and Alpine with ``gcompat`` has a glibc-named loader but is musl.
        Without ldd, ``getconf GNU_LIBC_VERSION`` (glibc only) decides, then the loaders alone. If both
        loaders exist and nothing else tells, musl is chosen because a musl build only needs its own loader.
        """
        ldd = (self.ldd_version or "").lower()
        if "musl" in ldd:
            return "musl"
        if "glibc" in ldd or "gnu libc" in ldd or "gnu c library" in ldd:
            return "glibc"
        if self.gnu_libc_version:
            return "glibc"
        if self.musl_loader:
            return "musl"
        return "glibc"

    @property
    def python3_version_info(self) -> tuple[int, ...] | None:
        if not self.python3_version:
            return None
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", self.python3_version)
        if not m:
            return None
        return tuple(int(g) for g in m.groups() if g is not None)

    @property
    def has_shell(self) -> bool:
        return bool(self.sh or self.bash)


def probe_script() -> str:
    """A POSIX ``sh`` script that prints the sandbox's facts as ``key=value`` lines (never fails)."""
    # `emit` strips newlines so one fact is always one line. No `set -e`: a missing tool is a fact.
    return r"""emit() { printf '%s=%s\n' "$1" "$(printf '%s' "$2" | tr -d '\r\n')"; }
first() { for f in "$@"; do if [ -e "$f" ]; then printf '%s' "$f"; return 0; fi; done; return 0; }
echo 'opencode_tui_probe=1'
emit os "$(uname -s 2>/dev/null)"
emit machine "$(uname -m 2>/dev/null)"
emit musl_loader "$(first /lib/ld-musl-*.so.1 /usr/lib/ld-musl-*.so.1)"
emit glibc_loader "$(first /lib64/ld-linux-*.so.2 /lib/ld-linux-*.so.* /lib/*-linux-gnu/ld-linux-*.so.* \
  /usr/lib/*-linux-gnu/ld-linux-*.so.*)"
# Alpine's ldd prints "musl libc ..." to stderr and exits 1; glibc's says "ldd (... GLIBC ...)".
if command -v ldd >/dev/null 2>&1; then emit ldd_version "$(ldd --version 2>&1 | head -n 1)"
else emit ldd_version ""; fi
emit gnu_libc_version "$(getconf GNU_LIBC_VERSION 2>/dev/null)"
if [ -r /proc/cpuinfo ]; then
  if grep -E '^flags[[:space:]]*:' /proc/cpuinfo 2>/dev/null | head -n 1 | grep -qw avx2; then emit avx2 yes
  elif grep -qE '^flags[[:space:]]*:' /proc/cpuinfo 2>/dev/null; then emit avx2 no
  else emit avx2 unknown; fi
else emit avx2 unknown; fi
py="$(command -v python3 2>/dev/null)"
emit python3 "$py"
if [ -n "$py" ]; then
  emit python3_version "$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"
else emit python3_version ""; fi
emit rg "$(command -v rg 2>/dev/null)"
emit sh "$(command -v sh 2>/dev/null)"
emit bash "$(command -v bash 2>/dev/null)"
emit uid "$(id -u 2>/dev/null)"
emit apt_get "$(command -v apt-get 2>/dev/null)"
emit apk "$(command -v apk 2>/dev/null)"
echo 'opencode_tui_probe_end=1'
"""


_PATH_KEYS = (
    "os",
    "musl_loader",
    "glibc_loader",
    "ldd_version",
    "gnu_libc_version",
    "python3",
    "python3_version",
    "rg",
    "sh",
    "bash",
    "apt_get",
    "apk",
)


def parse_probe(text: str) -> SandboxFacts:
    """Parse ``probe_script()`` output; unrelated lines (a shell banner, a motd) are ignored."""
    lines = [line.strip() for line in text.splitlines()]
    try:
        start = lines.index(PROBE_START)
    except ValueError:
        raise ProbeError("probe output has no start marker; the probe script did not run") from None
    try:
        end = lines.index(PROBE_END, start + 1)
    except ValueError:
        raise ProbeError("probe output is truncated (no end marker): the probe did not finish") from None
    raw: dict[str, str] = {}
    for line in lines[start + 1 : end]:
        key, sep, value = line.partition("=")
        if sep:
            raw[key] = value.strip()
    machine = raw.get("machine", "")
    if not machine:
        raise ProbeError("probe output has no machine (uname -m) value")
    fields: dict[str, object] = {k: (raw.get(k) or None) for k in _PATH_KEYS}
    avx2 = raw.get("avx2", "unknown")
    fields["avx2"] = True if avx2 == "yes" else False if avx2 == "no" else None
    uid = raw.get("uid", "")
    fields["uid"] = int(uid) if uid.isdigit() else None
    return SandboxFacts(machine=machine, **fields)  # type: ignore[arg-type]


def normalize_arch(machine: str) -> Arch:
    """Map ``uname -m`` to OpenCode's arch name; an unknown arch raises ``UnsupportedTargetError``."""
    arch = _ARCH_ALIASES.get(machine.strip().lower())
    if arch is None:
        raise UnsupportedTargetError(
            f"unsupported CPU architecture {machine!r}: OpenCode publishes Linux builds only for "
            "x86_64 (x64) and aarch64 (arm64); use a sandbox image for one of those"
        )
    return arch


def select_target(facts: SandboxFacts) -> Target:
    """Pick the OpenCode build for a sandbox: arch from ``uname -m``, libc, and AVX2 (x64 only).

    Unknown AVX2 support selects the baseline build, which runs on every x64 CPU.
    """
    if facts.os and facts.os.lower() != "linux":
        raise UnsupportedTargetError(f"unsupported operating system {facts.os!r}: sandboxes must run Linux")
    arch = normalize_arch(facts.machine)
    baseline = arch == "x64" and facts.avx2 is not True
    return Target(arch=arch, libc=facts.libc, baseline=baseline)
