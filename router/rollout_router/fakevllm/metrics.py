"""The subset of vLLM V1's Prometheus metrics a router scrapes, under vLLM's own names.

Each server gets its own registry, so several can live in one process (tests).
Counters are declared without ``_total``: prometheus_client appends it, and the
exposition reads ``vllm:prompt_tokens_total`` exactly as vLLM's does.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FINISHED_REASONS = ("stop", "length", "abort")
# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class Metrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self._labels = {"model_name": model_name, "engine": "0"}
        self.num_requests_running = self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_cache_resets = self._counter(
            "fakevllm:prefix_cache_resets", "Prefix-cache resets (POST /reset_prefix_cache) that succeeded.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.")
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            list(self._labels), registry=self.registry, buckets=TTFT_BUCKETS,
        ).labels(**self._labels)
        self._request_success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            [*self._labels, "finished_reason"], registry=self.registry)
        for reason in FINISHED_REASONS:
            self._request_success.labels(**self._labels, finished_reason=reason)

    def bind(self, running: Callable[[], float], waiting: Callable[[], float],
             kv_cache_usage: Callable[[], float]) -> None:
        """Read the gauges from the engine at scrape time, so they are never stale."""
        self.num_requests_running.set_function(running)
        self.num_requests_waiting.set_function(waiting)
        self.kv_cache_usage.set_function(kv_cache_usage)

    def request_finished(self, reason: str) -> None:
        self._request_success.labels(**self._labels, finished_reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, list(self._labels), registry=self.registry).labels(**self._labels)

    def _counter(self, name: str, documentation: str) -> Counter:
        return Counter(name, documentation, list(self._labels), registry=self.registry).labels(**self._labels)
