"""Where the fleet's parameters come from: the DAPO recipe, the model's shape and the GPU.

Every number the presets and the grid take from outside is named here once,
with its source, so a reader can check it and a change is one line:

* the recipe (verl ``recipe/dapo/run_dapo_qwen2.5_32b.sh``): ``gen_prompt_bsz``
  = 3 x 512 = 1,536 prompts, ``n_resp_per_prompt`` 16, ``NNODES`` 16 x
  ``n_gpus_per_node`` 8 GPUs at ``gen_tp`` 4 (= 32 vLLM replicas),
  ``gpu_memory_utilization`` 0.80, ``max_num_batched_tokens`` 2,048 + 20,480;
  verl's rollout default ``max_num_seqs`` 1024; its sticky map
  (``DEFAULT_ROUTING_CACHE_SIZE``) 10,000 entries;
* the published runs (verl PR #7435): the approximate final context of each
  row (2.2K, 8.7K, 19.8K tokens) and no tool latency;
* the GPU (H200, 141 GB, about 140.4 GiB visible) and the model's bytes
  (``CostModel``: Qwen2.5-32B bf16 weights, 256 KiB of KV per token) give the
  KV pool: see ``kv_pool_tokens``.
"""
from __future__ import annotations

import dataclasses

from .cost import CostModel

GIB = 2**30

# The recipe (verl recipe/dapo/run_dapo_qwen2.5_32b.sh) and verl's defaults.
RECIPE_PROMPTS = 1536  # gen_prompt_bsz = train_prompt_bsz (512) * 3
RECIPE_N = 16  # n_resp_per_prompt
RECIPE_REPLICAS = 16 * 8 // 4  # NNODES * n_gpus_per_node / gen_tp
RECIPE_TRAJECTORIES = RECIPE_PROMPTS * RECIPE_N  # 24,576 per step
RECIPE_PER_REPLICA = RECIPE_TRAJECTORIES // RECIPE_REPLICAS  # 768 trajectories per replica
RECIPE_MAX_BATCHED_TOKENS = 2048 + 20480  # max_prompt_length + max_response_length
VERL_MAX_NUM_SEQS = 1024  # verl rollout config default
VERL_STICKY_ENTRIES = 10_000  # verl load_balance.py DEFAULT_ROUTING_CACHE_SIZE

# The published rows (verl PR #7435): approximate final context; the runs had no tool latency.
PUBLISHED_CONTEXT = {"ctx2k": 2200, "ctx9k": 8700, "ctx20k": 19800}
PUBLISHED_TOOL_LATENCY = 0.0


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU of a replica and the share of it vLLM takes."""

    memory_gib: float = 140.4  # H200 141 GB as the driver reports it
    memory_utilization: float = 0.80  # the recipe's gpu_memory_utilization
    activations_gib: float = 4.5  # activations + CUDA graphs: midpoint of the background's 3-6 GiB estimate


def kv_pool_tokens(cost: CostModel = CostModel(), gpu: Gpu = Gpu()) -> int:
    """Tokens of KV cache one replica holds: what vLLM's share of a GPU keeps after weights and activations.

    Each GPU of a TP group holds 1/TP of the weights and 1/TP of every token's
    KV, so the pool per replica is the pool per GPU::

        (memory * utilization - weights/TP - activations) / (KV bytes per token / TP)

    H200, 0.80, Qwen2.5-32B at TP 4: (140.4 x 0.8 - 15.26 - 4.5) GiB / 64 KiB
    = 92.56 GiB x 16,384 tokens/GiB = 1,516,583 tokens (about 1.5M; 1,746,615 at 0.90).
    Check against a published pool: llm-d reports 307,328 tokens for Qwen-32B on 2 x H100 80 GB;
    this formula at TP 2, 79.65 GiB, 0.90 gives 300,440 (-2.2%).
    """
    free = gpu.memory_gib * GIB * gpu.memory_utilization - cost.weight_bytes_gpu - gpu.activations_gib * GIB
    return int(free // cost.kv_bytes_token_gpu)


PHYSICAL_KV_TOKENS = kv_pool_tokens()
