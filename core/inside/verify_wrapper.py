"""How the task's verifier ended, told apart: an exit code, or a signal.

Runs on the sandbox's python3 (>= 3.8, stdlib only) as ``python3 -c <this file> COMMAND STATUS_PATH``.
A shell reports a killed child as 128+N, which a provider cannot tell from ``exit 128+N``; this wrapper
sees the real wait status and writes it atomically to STATUS_PATH as ``{"exit_code", "signal"}``.
It exits like its child (128+N for a signal).
"""

import json
import os
import subprocess
import sys


def main(command, status_path):
    rc = subprocess.run(["/bin/sh", "-c", command]).returncode
    status = {"exit_code": rc, "signal": None} if rc >= 0 else {"exit_code": None, "signal": -rc}
    with open(status_path + ".tmp", "w") as f:
        json.dump(status, f)
    os.replace(status_path + ".tmp", status_path)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
