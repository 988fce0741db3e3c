"""How the task's verifier ended, told apart: an exit code, or a signal.

The verifier runs as ``python3 -c VERIFY_WRAPPER_SOURCE COMMAND STATUS_PATH`` inside the sandbox (the
program is core/inside/verify_wrapper.py). A shell reports a killed child as 128+N, which a provider
cannot tell from ``exit 128+N``; the wrapper sees the real wait status and writes it atomically to
STATUS_PATH. When the wrapper itself was killed (``kill -9 -1``), the file is missing and the
provider's exit status is all there is: a kill.
"""

from __future__ import annotations

import json
import signal as _signal
from typing import TYPE_CHECKING

from opencode_tui_core.inside import INSIDE_DIR

if TYPE_CHECKING:
    from opencode_tui_core.sandbox.base import ExecResult, Sandbox

# The wrapper program (core/inside/verify_wrapper.py), read at import; it runs as
# ``python3 -c VERIFY_WRAPPER_SOURCE COMMAND STATUS_PATH``: nothing is uploaded for it.
VERIFY_WRAPPER_SOURCE = (INSIDE_DIR / "verify_wrapper.py").read_text()

_MAX_SIGNAL = max(int(s) for s in _signal.Signals)


async def read_verify_status(
    sandbox: Sandbox, status_path: str, result: ExecResult
) -> tuple[int | None, int | None]:
    """(exit_code, signal) of the verifier command, from the wrapper's status file when it wrote one."""
    try:
        raw = await sandbox.download_file(status_path)
        status = json.loads(raw)
        exit_code, signal = status.get("exit_code"), status.get("signal")
        if (exit_code is None) != (signal is None):
            return exit_code, signal
    except Exception:  # a missing or torn file: the wrapper did not finish
        pass
    # The wrapper itself did not report: it was killed (or never ran). Only the provider's view is left.
    if result.signal is not None:
        return None, result.signal
    code = result.exit_code
    if code is not None and 128 < code <= 128 + _MAX_SIGNAL:
        return None, code - 128
    return code, None
