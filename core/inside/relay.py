#!/usr/bin/env python3
"""TCP-to-Unix-socket relay, uploaded into a model-only sandbox (stdlib only, Python >= 3.8).

A model-only sandbox has no network, only loopback. OpenCode inside it talks HTTP to
``127.0.0.1:<port>``; this relay forwards each TCP connection, byte for byte in both directions,
to the model proxy's Unix socket bound into the sandbox (default ``/run/opencode-tui/model.sock``).

Usage::

    python3 relay.py PORT [UNIX_SOCKET_PATH]

``PORT`` 0 picks a free port. The port actually listened on is always printed on stdout as the
first line (flushed), so a caller can read it. The relay runs until it is killed.
"""

import os
import socket
import sys
import threading
from pathlib import Path

DEFAULT_SOCKET = "/run/opencode-tui/model.sock"
LISTEN_HOST = "127.0.0.1"
BUFFER_SIZE = 65536
# After the upstream side has finished, how long the client may keep its sending side open.
CLIENT_LINGER_S = 60.0

# The file to upload into the sandbox (this very module).
RELAY_SCRIPT_PATH = Path(os.path.abspath(__file__))


def _log(message):
    try:
        sys.stderr.write(f"relay: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _shutdown(sock, how):
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _pump(src, dst):
    """Copy src -> dst until EOF or error, then half-close dst's sending side."""
    try:
        while True:
            data = src.recv(BUFFER_SIZE)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _shutdown(dst, socket.SHUT_WR)


def _serve_connection(client, socket_path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)
    except OSError as exc:
        _log(f"cannot reach {socket_path}: {exc}")
        upstream.close()
        client.close()
        return
    to_upstream = threading.Thread(target=_pump, args=(client, upstream), daemon=True)
    to_upstream.start()
    try:
        _pump(upstream, client)
        to_upstream.join(CLIENT_LINGER_S)
    finally:
        for sock in (client, upstream):
            _shutdown(sock, socket.SHUT_RDWR)
            sock.close()


def serve(port, socket_path, out=None):
    """Listen on 127.0.0.1:port and relay every connection to ``socket_path``; never returns."""
    out = out or sys.stdout
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LISTEN_HOST, port))
    listener.listen(128)
    out.write(f"{listener.getsockname()[1]}\n")
    out.flush()
    if not os.path.exists(socket_path):
        _log(f"warning: {socket_path} does not exist (yet); connections fail until it does")
    while True:
        try:
            client, _ = listener.accept()
        except InterruptedError:
            continue
        except OSError as exc:
            _log(f"accept failed: {exc}")
            continue
        threading.Thread(target=_serve_connection, args=(client, socket_path), daemon=True).start()


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or len(args) > 2 or args[0] in ("-h", "--help"):
        sys.stderr.write("usage: relay.py PORT [UNIX_SOCKET_PATH]   (PORT 0 picks a free port)\n")
        return 2
    try:
        port = int(args[0])
        if not 0 <= port <= 65535:
            raise ValueError(port)
    except ValueError:
        sys.stderr.write(f"relay.py: PORT must be an integer between 0 and 65535, got {args[0]!r}\n")
        return 2
    socket_path = args[1] if len(args) > 1 else DEFAULT_SOCKET
    try:
        serve(port, socket_path)
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        sys.stderr.write(f"relay.py: cannot listen on {LISTEN_HOST}:{port}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
