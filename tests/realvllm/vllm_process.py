"""Real vLLM servers (CPU build, tiny local model) as processes for the real-vLLM tier.

Each server runs from the vLLM virtualenv in its own process group (vLLM forks an engine
process), logs to a file, listens on a loopback address and is stopped by its group id.
Nothing here reaches outside 127.0.0.0/8: the hub is offline and usage statistics are off.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc

SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 2048


def vllm_environment(cpu: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # no usage report leaves the machine
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; plenty for a 2-layer, 64-wide model
    })
    if cpu is not None:  # left alone, every server binds its OpenMP threads to core 0
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu
    for name in ("VIRTUAL_ENV", "PYTHONPATH"):  # the main venv's, not the vLLM one's
        env.pop(name, None)
    return env


@dataclass
class VllmServer:
    """One vLLM server: the OpenAI-compatible HTTP server, or (``grpc``) the gRPC frontend."""

    python: Path
    model: Path
    host: str
    port: int
    log_path: Path
    grpc: bool = False
    cpu: str | None = None
    max_model_len: int = MAX_MODEL_LEN
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after: float | None = None
    _log: object = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        module = "vllm.entrypoints.grpc_server" if self.grpc else "vllm.entrypoints.openai.api_server"
        # Without --enable-prompt-tokens-details, vLLM answers `"prompt_tokens_details": null`; with it,
        # usage carries cached_tokens per request, as the fake replica always does.
        extra = [] if self.grpc else ["--enable-prompt-tokens-details"]
        return [str(self.python), "-m", module, "--model", str(self.model), "--served-model-name", SERVED_MODEL,
                "--host", self.host, "--port", str(self.port), "--max-model-len", str(self.max_model_len),
                "--enable-prefix-caching", "--enforce-eager", *extra, *self.extra_args]

    def start(self) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL,
                                        env={**vllm_environment(self.cpu), **self.extra_env},
                                        start_new_session=True)
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _answers(self) -> bool:
        if self.grpc:
            with grpc.insecure_channel(self.target) as channel:
                try:
                    grpc.channel_ready_future(channel).result(timeout=1)
                except grpc.FutureTimeoutError:
                    return False
                from smg_grpc_proto.generated import vllm_engine_pb2 as pb
                from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
                try:
                    return pb_grpc.VllmEngineStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=2).healthy
                except grpc.RpcError:
                    return False
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_ready(self, timeout: float) -> float:
        """Block until the server answers; returns seconds since start. Raises with the log's tail."""
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM at {self.target} exited with {self.process.returncode}:\n{self.log_tail()}")
            if self._answers():
                if self.ready_after is None:
                    self.ready_after = time.monotonic() - self.started_at
                return self.ready_after
            time.sleep(0.5)
        raise TimeoutError(f"vLLM at {self.target} not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group (API server and engine core): a crash, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._reap_group(signal.SIGKILL)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._reap_group(signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _reap_group(self, sig: int) -> None:
        """The engine process may outlive its parent; end whatever is left in the group."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
