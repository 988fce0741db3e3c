#!/usr/bin/env python3
"""OpenCode's database as its first start leaves it, built inside the sandbox (stdlib only, Python >= 3.8).

Runs ``BINARY db "PRAGMA wal_checkpoint(TRUNCATE)"`` with a private, empty HOME and XDG directories: the
binary creates its database and applies every migration, then checkpoints the write-ahead log into the
database file, so the file alone holds the whole state. Prints one JSON object on stdout: each database
file OpenCode made in its data directory (name → base64 content); removes its directory in all cases.

Usage::

    python3 first_run.py OPENCODE_BINARY ENV_JSON TIMEOUT_S

``ENV_JSON``: the OpenCode environment switches to run it with (a JSON object of strings).
Exit status: 0 with the JSON on stdout; 1 when OpenCode failed or left no checkpointed database.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

# SQLite's file header: anything else is not a database OpenCode could open.
SQLITE_MAGIC = b"SQLite format 3\x00"


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: first_run.py OPENCODE_BINARY ENV_JSON TIMEOUT_S\n")
        return 2
    binary, extra, timeout = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    work = tempfile.mkdtemp(prefix=".opencode-tui-first-run-")
    try:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8"}
        env.update({str(k): str(v) for k, v in extra.items()})
        for kind in ("config", "data", "cache", "state"):
            env[f"XDG_{kind.upper()}_HOME"] = os.path.join(work, kind)
        try:
            r = subprocess.run(
                [binary, "db", "PRAGMA wal_checkpoint(TRUNCATE)"],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"opencode db did not finish within {timeout:g}s\n")
            return 1
        if r.returncode != 0:
            tail = r.stderr[-500:].decode("utf-8", "replace")
            sys.stderr.write(f"opencode db exited with {r.returncode}: {tail}\n")
            return 1
        data_dir = os.path.join(work, "data", "opencode")
        found = {}
        for name in sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else []:
            path = os.path.join(data_dir, name)
            if not name.endswith(".db") or not os.path.isfile(path):
                continue
            wal = path + "-wal"
            if os.path.exists(wal) and os.path.getsize(wal) > 0:
                sys.stderr.write(f"{name}: the write-ahead log was not checkpointed\n")
                return 1
            with open(path, "rb") as f:
                content = f.read()
            if not content.startswith(SQLITE_MAGIC):
                sys.stderr.write(f"{name} is not an SQLite database\n")
                return 1
            found[name] = base64.b64encode(content).decode("ascii")
        if not found:
            sys.stderr.write(f"opencode db left no database in {data_dir}\n")
            return 1
        sys.stdout.write(json.dumps(found))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
