"""What verl sends, read from verl's source: every value the verl presets take, named once with its source.

Citations are ``file@commit`` in ``volcengine/verl`` (``b178a3cd`` = main of
2026-01-29, the snapshot read for this module) or ``file@0.9.1`` (the release
pip-installed by ``make install-test``, under ``.venv/lib/python3.11/site-packages/verl``).
A value marked **[est]** is arithmetic or judgment, said how; a value that
no source publishes is not here at all: it is an axis of the verl grid
(``sim.verlgrid``), never a number fitted to the published rows.
"""
from __future__ import annotations

import math

from .cost import CostModel
from .sources import Gpu, kv_pool_tokens

VERL = "b178a3cd56f58b2d502255daba591e92833930a7"

# --- the agent loops (verl/experimental/agent_loop/*.py@b178a3cd; the same at 0.9.1) ------------------------
# single_turn_agent_loop.py: one generate() per sample with request_id=uuid4().hex, so no request is a sticky hit.
# tool_agent_loop.py run(): request_id = uuid4().hex once per sample, passed on every turn. A turn ends at EOS
# (the hermes parser: right after </tool_call>, per ../shared/notes/verl-traffic.md); the loop stops when
# len(response_mask) >= response_length, at max_assistant_turns, on a turn without a tool call, or when the tool's
# tokens would reach response_length.
# Tool text longer than max_tool_response_length characters is cut in the middle (the default side):
# text[:128] + "...(truncated)..." + text[-128:].
MAX_TOOL_RESPONSE_CHARS = 256  # rollout.yaml multi_turn.max_tool_response_length@b178a3cd
TRUNCATION_MARKER_CHARS = len("...(truncated)...")  # tool_agent_loop.py _call_tool@b178a3cd
# Characters to tokens: Qwen2.5's byte-level BPE emits at most one token per byte, and its pre-tokenizer isolates
# every digit (the alternative \p{N} in the Split regex of Qwen2/2.5's tokenizer.json; Llama 3's has \p{N}{1,3}), so a
# code interpreter's numeric output costs close to one token per character: the rule is 1 token per character, an
# upper bound for ASCII text.
TOOL_CHARS_PER_TOKEN = 1.0
# The tool message's chat-template tokens (Qwen2.5: "<|im_start|>user\n<tool_response>\n" ... "\n</tool_response>
# <|im_end|>\n<|im_start|>assistant\n") [est: counted by hand, about 15].
TOOL_TEMPLATE_TOKENS = 15
# How long the capped tool text is before the cap: not published (sandbox-fusion outputs on DAPO-Math); the cap
# is used, the upper bound of what verl appends.
TOOL_RESULT_TOKENS = TOOL_TEMPLATE_TOKENS + math.ceil(
    (MAX_TOOL_RESPONSE_CHARS + TRUNCATION_MARKER_CHARS) / TOOL_CHARS_PER_TOKEN)

# Per-turn max_tokens: vllm_async_server.py generate()@0.9.1, when the sampling params carry none (agent_loop.py
# passes temperature, top_p, top_k, repetition_penalty, logprobs only): min(response_length, prompt_length +
# response_length - len(prompt_ids)), clamped to [1, max_model_len - len(prompt_ids)]. (At b178a3cd the
# min(response_length, ...) was not there yet.) max_model_len is taken as >= prompt_length + response_length.

# The sandbox's concurrent tool calls, fleet-wide: the ReTool recipe's tool config (verl-recipe
# retool/sandbox_fusion_tool_config.yaml@48ea0a79: rate_limit 128, enable_global_rate_limit true, default_timeout 30)
# for the verl it pins (retool/REQUIRED_VERL.txt@48ea0a79: v0.6.1, d62da495): verl/tools/sandbox_fusion_tools.py@v0.6.1
# takes a slot of one named Ray actor per job ("rate-limiter", a threading.Semaphore(rate_limit)) around every
# execution, so at most 128 calls run at once over the whole rollout; the rest wait (in about arrival order: Ray's
# queue and the semaphore's wake-ups, not a guaranteed FIFO; modelled as FIFO). num_workers 128 bounds each agent-loop
# worker's own pool, not the fleet.
TOOL_SLOTS = 128

# --- one step's traffic ------------------------------------------------------------------------------------------
AGENT_WORKERS = 8  # rollout.yaml agent.num_workers@b178a3cd and @0.9.1; agent_loop.py: prompts.chunk(len(workers)),
# contiguous equal chunks (protocol.py DataProto.chunk@0.9.1)
STICKY_ENTRIES = 10_000  # one cachetools.LRUCache for the fleet, no idle timeout (llm_server.py@0.9.1)
MAX_NUM_SEQS = 256  # rollout.yaml max_num_seqs@b178a3cd and @0.9.1 (1024 up to v0.8.0, per the notes)
DEFAULT_TP, DEFAULT_GPU_UTIL = 2, 0.5  # rollout.yaml tensor_model_parallel_size, gpu_memory_utilization@b178a3cd
DEFAULT_MAX_BATCHED_TOKENS = 8192  # rollout.yaml max_num_batched_tokens@b178a3cd

# --- the shared prefix [est] -------------------------------------------------------------------------------------
# Every trajectory starts with the chat template's system prompt (Qwen2.5: "You are Qwen, created by Alibaba Cloud.
# You are a helpful assistant." and its markers, ~25 tokens) and DAPO-Math-17k's fixed instruction ("Solve the
# following math problem step by step. The last line of your response should be of the form Answer: $Answer ...",
# ~35 tokens). Under tool_agent the system prompt also carries the tool-schema block (Qwen2.5's "# Tools ... <tools>
# {code_interpreter schema} </tools> ... <tool_call>" instructions, ~200 tokens). Counted by hand, not tokenized.
SHARED_SINGLE_TURN_TOKENS = 25 + 35
SHARED_TOOL_AGENT_TOKENS = SHARED_SINGLE_TURN_TOKENS + 200
PROBLEM_MEDIAN_TOKENS = 160  # [est] the problem text after the instruction: DAPO-Math-17k problems are short


# --- recipes --------------------------------------------------------------------------------------------------------
def replicas(nodes: int, gpus_per_node: int, tp: int) -> int:
    """vLLM replicas of a recipe: its rollout GPUs over the TP size."""
    return nodes * gpus_per_node // tp


RECIPES = "48ea0a797fa29867ea0ad92aff7d284eec7d4be3"  # verl-project/verl-recipe main of 2026-08-05
# dapo/run_dapo_qwen2.5_32b.sh@48ea0a79 (verl-recipe): n 16,
# gen_prompt_bsz 1536, max_prompt 2048, max_response 20480, gen_tp 4, util 0.80, max_num_batched_tokens 22528,
# 16 nodes x 8 GPUs; single turn.
DAPO32B = dict(prompts=1536, n=16, prompt_length=2048, response_length=20480, tp=4, util=0.80,
               max_batched_tokens=22528, replicas=replicas(16, 8, 4))
# retool/run_qwen2-32b_dapo.sh@48ea0a79 (verl-recipe): tool_agent (hermes), max_assistant_turns 8, n 16,
# train_batch_size 512, 2048 / 16384, infer_tp 4, util 0.9, 2 nodes x 8 GPUs; max_num_batched_tokens not set
# (rollout.yaml's 8192).
RETOOL32B = dict(prompts=512, n=16, prompt_length=2048, response_length=16384, tp=4, util=0.9,
                 max_batched_tokens=DEFAULT_MAX_BATCHED_TOKENS, replicas=replicas(2, 8, 4), max_assistant_turns=8)
# verl/experimental/fully_async_policy/shell/dapo_7b_async_retool.sh@b178a3cd: max_turns 16, 2048 / 16384,
# infer_tp 4, util 0.8, n 16, gen_prompt_bsz 1 (samples stream in), 1 node with 4 rollout GPUs: one replica.
ASYNC_RETOOL7B = dict(prompts=1, n=16, prompt_length=2048, response_length=16384, tp=4, util=0.8,
                      max_batched_tokens=DEFAULT_MAX_BATCHED_TOKENS, replicas=replicas(1, 4, 4), max_assistant_turns=16)
# verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_64_64.sh@b178a3cd: Qwen2.5-Math-7B, 2048 / 28672,
# gen_tp 4, util 0.80, max_num_batched_tokens 2048 + 28672, train_prompt_bsz 512, n 16, 8 rollout nodes x 8 GPUs;
# single turn. Its trainer (one_step_off_policy/ray_trainer.py) is the one with timing_s/generate_async.
ONE_STEP_OFF7B = dict(prompts=512, n=16, prompt_length=2048, response_length=28672, tp=4, util=0.80,
                      max_batched_tokens=2048 + 28672, replicas=replicas(8, 8, 4))

# Qwen2.5-7B (Qwen2.5-Math-7B has the same shape), config.json on Hugging Face: 28 layers, hidden 3584, 4 KV heads,
# head_dim 128, 7.62B parameters; linear FLOPs per token ~ 2 x 7.07B non-embedding-plus-head [est].
QWEN7B = CostModel(layers=28, hidden=3584, kv_heads=4, head_dim=128, params=7.62e9, linear_flops_per_token=14.1e9)
QWEN32B = CostModel()


def pool(cost: CostModel, tp: int, util: float) -> int:
    """KV tokens per replica on the H200 of ``sources.Gpu`` (the recipes do not name the GPU) [est]."""
    return kv_pool_tokens(CostModel(**{**cost.__dict__, "tp": tp}), Gpu(memory_utilization=util))
