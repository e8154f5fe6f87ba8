"""Roofline step-time model of one vLLM replica (defaults: Qwen2.5-32B, bf16, TP 4, H200).

One engine step reads the weights once, reads the KV of every scheduled token's
context, and does the linear and attention FLOPs of every scheduled token::

    t = max(t_mem, t_compute) + t_fixed
    t_mem     = (weights/TP + kv_bytes_per_token/TP * context_read) / (HBM_bw * bw_eff)
    t_compute = (tokens * linear_flops + attn_flops_per_ctx * attended_pairs) / (TP * peak * mfu)
    t_fixed   = 2 * layers * allreduce_latency + step_overhead

A run of ``k`` decode-only steps with a fixed batch of ``B`` sequences whose
contexts sum to ``S`` (growing by ``B`` per step) has a closed-form total, so the
simulator advances many steps at once instead of looping per token.
See docs/simulator.md for the sources of every constant.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CostModel:
    layers: int = 64
    hidden: int = 5120
    kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    params: float = 32.76e9
    linear_flops_per_token: float = 64e9
    tp: int = 4
    peak_flops: float = 989e12  # per GPU, dense bf16
    mfu: float = 0.5
    hbm_bw: float = 4.8e12  # bytes/s per GPU
    bw_eff: float = 0.72
    allreduce_s: float = 20e-6
    overhead_s: float = 500e-6

    @property
    def weight_bytes_gpu(self) -> float:
        return self.params * self.dtype_bytes / self.tp

    @property
    def kv_bytes_token_gpu(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes / self.tp

    @property
    def attn_flops_per_ctx(self) -> float:
        return 4.0 * self.layers * self.hidden

    @property
    def fixed_s(self) -> float:
        return 2 * self.layers * self.allreduce_s + self.overhead_s

    def _coeffs(self) -> tuple[float, float, float, float]:
        bw = self.hbm_bw * self.bw_eff
        fl = self.tp * self.peak_flops * self.mfu
        return self.weight_bytes_gpu / bw, self.kv_bytes_token_gpu / bw, self.linear_flops_per_token / fl, self.attn_flops_per_ctx / fl

    def step_time(self, tokens: int, ctx_read: float, attn_pairs: float) -> float:
        """One engine step: ``tokens`` scheduled, ``ctx_read`` KV tokens read, ``attn_pairs`` query-key pairs."""
        w, kv, lin, att = self._coeffs()
        return max(w + kv * ctx_read, lin * tokens + att * attn_pairs) + self.fixed_s

    def prefill_seconds_per_token(self, ctx: float = 0.0) -> float:
        """Compute-bound prefill cost of one token at context ``ctx`` (for the lower bound)."""
        _, _, lin, att = self._coeffs()
        return lin + att * ctx

    def decode_run(self, batch: int, ctx_sum: float, k: int) -> float:
        """Total seconds of ``k`` decode-only steps; step i reads ``ctx_sum + batch*i`` KV tokens."""
        if k <= 0:
            return 0.0
        w, kv, lin, att = self._coeffs()
        # mem_i = a + b i ; cmp_i = c + d i
        a, b = w + kv * ctx_sum, kv * batch
        c, d = lin * batch + att * ctx_sum, att * batch
        return _sum_max(a, b, c, d, k) + k * self.fixed_s

    def decode_steps_within(self, batch: int, ctx_sum: float, k: int, elapsed: float) -> int:
        """How many of ``k`` decode steps have fully finished ``elapsed`` seconds after the run began."""
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_run(batch, ctx_sum, mid) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _linsum(a: float, b: float, i0: int, i1: int) -> float:
    """sum_{i0 <= i < i1} (a + b i)."""
    n = i1 - i0
    if n <= 0:
        return 0.0
    return a * n + b * (i0 + i1 - 1) * n / 2


def _sum_max(a: float, b: float, c: float, d: float, k: int) -> float:
    """sum_{0 <= i < k} max(a + b i, c + d i) for two straight lines."""
    first_mem = a >= c
    last_mem = a + b * (k - 1) >= c + d * (k - 1)
    if first_mem == last_mem:
        return _linsum(a, b, 0, k) if first_mem else _linsum(c, d, 0, k)
    # one crossing: find first i where the dominant line switches
    x = (c - a) / (b - d)  # a + b x == c + d x
    split = min(max(int(x) + 1, 0), k)
    if first_mem:
        return _linsum(a, b, 0, split) + _linsum(c, d, split, k)
    return _linsum(c, d, 0, split) + _linsum(a, b, split, k)
