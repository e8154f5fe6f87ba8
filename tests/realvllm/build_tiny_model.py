"""Build a tiny random Llama model that real vLLM can serve on the CPU, with no download.

Run with the vLLM virtualenv's interpreter (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python tests/realvllm/build_tiny_model.py .cache/tiny-model

A byte-level BPE tokenizer (vocabulary 512) is trained on generated text and wrapped in
``PreTrainedTokenizerFast`` with a chat template; the model is a ``LlamaConfig`` with 2 layers,
hidden size 64 and 2 heads, random weights from a fixed seed. Its answers are gibberish: the
tier checks routing, streaming, metrics and prefix caching, never the text. The directory is
written atomically (a temporary sibling renamed into place), so a half-built model is never used.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus() -> list[str]:
    words = ["solve", "the", "equation", "tool", "said", "ok", "and", "then", "count", "once", "upon",
             "a", "time", "x", "+", "1", "=", "2", "answer", "is", "turn", "user", "assistant", "why",
             "what", "next", "step", "hello", "world", "rollout", "router", "prefix", "cache"]
    lines = []
    for i in range(2000):
        lines.append(" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(12)) + f" {i}")
    return lines


def build(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)

    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    fast.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def reweight(source: Path, target: Path, seed: int) -> None:
    """The same model (architecture, tokenizer) with other random weights: the RL tier's "next step" checkpoint."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    LlamaForCausalLM(AutoConfig.from_pretrained(source)).save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "--reweight":  # --reweight SOURCE_DIR TARGET_DIR SEED
        reweight(Path(argv[2]).resolve(), Path(argv[3]).resolve(), int(argv[4]))
        print(f"realvllm setup: reweighted copy of {argv[2]} in {argv[3]}")
        return 0
    if len(argv) != 2:
        print(f"usage: {argv[0]} MODEL_DIR  |  {argv[0]} --reweight SOURCE_DIR TARGET_DIR SEED", file=sys.stderr)
        return 2
    target = Path(argv[1]).resolve()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        print(f"realvllm setup: tiny model already in {target}")
        return 0
    build(target)
    print(f"realvllm setup: tiny model built in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
