"""A simulated vLLM replica: OpenAI-compatible, with vLLM's metrics, prefix cache and batching.

``config`` holds the knobs; ``tokens`` is the fake tokenizer; ``prefix_cache``
the KV block pool; ``scheduler`` vLLM V1's continuous batching; ``engine`` runs
it in simulated real time; ``api`` and ``protocol`` are the HTTP side;
``metrics`` the Prometheus side; ``grpc_api`` vLLM's gRPC ``VllmEngine``
service on the same engine (imported on first use of ``start_grpc``, so the
HTTP-only replica never loads grpcio); ``cli`` the ``fake-vllm`` subcommand.
"""
from .api import create_app
from .cli import add_arguments, run, serve
from .config import FakeVllmConfig

__all__ = ["FakeVllmConfig", "add_arguments", "create_app", "run", "serve", "start_grpc"]


def __getattr__(name: str) -> object:
    if name == "start_grpc":
        from .grpc_api import start_grpc

        return start_grpc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
