"""A blocking client of a run's control socket (``opencode-tui ctl``, scripts, tests)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from opencode_tui_core.debugger.control_socket import connect_path
from opencode_tui_core.debugger.protocol import CtlReply, CtlRequest

TIMEOUT_S = 45.0  # above the engine's own bound on a say/abort in the sandbox (serve_acts: 30 s)


class NotLive(Exception):
    """No live run answers at this run directory (ended, never debugged, or another user's)."""


def request(run_dir: Path, req: CtlRequest, timeout: float = TIMEOUT_S) -> CtlReply:
    path = connect_path(Path(run_dir))
    if not path.exists():
        raise NotLive(f"{run_dir} is not a live run (no control socket: it ended, or was never started)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        target = str(path)
        if len(os.fsencode(target)) > 100:  # too long for sockaddr_un: connect relative to its directory
            cwd = os.getcwd()
            os.chdir(path.parent)
            try:
                sock.connect(path.name)
            finally:
                os.chdir(cwd)
        else:
            sock.connect(target)
        sock.sendall(req.model_dump_json(exclude_none=True).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except PermissionError as exc:
        raise NotLive(f"{run_dir}: the control socket is not ours ({exc.strerror})") from exc
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        raise NotLive(f"{run_dir} is not a live run (its control socket does not answer)") from exc
    except OSError as exc:
        raise NotLive(f"{run_dir}: cannot talk to the run: {exc.strerror or exc}") from exc
    finally:
        sock.close()
    if not data:
        raise NotLive(f"{run_dir}: the run closed the connection without answering")
    return CtlReply.model_validate_json(data)
