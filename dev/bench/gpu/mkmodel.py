"""A random-initialised model of a real shape, for engines on a machine without the hub.

``python3 -m bench.gpu.mkmodel OUT_DIR [--shape llama-1b|llama-8b]`` (on the GPU machine, with
the image's torch, transformers and tokenizers) writes a Llama-3-shaped checkpoint in bf16
safetensors and a byte-level BPE tokenizer of exactly the Llama-3 vocabulary size (128,256
ids, 256 of them special, every id decodable) with a Llama-3-style chat template. The text it
generates is noise; load time, memory, kernels and scheduling are those of the real shape.
Prints one JSON line (parameters, seconds, files).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.2-1B's config.json dimensions (1.24 B parameters, tied embeddings).
    "llama-1b": {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "tie_word_embeddings": True,
    },
    # meta-llama/Llama-3.1-8B's (8.03 B parameters).
    "llama-8b": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "tie_word_embeddings": False,
    },
}  # fmt: skip
REGULAR_IDS = 128_000
SPECIAL_IDS = 256
VOCAB = REGULAR_IDS + SPECIAL_IDS
# Llama 3's named special tokens and their offsets above the regular ids.
NAMED_SPECIALS = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "<|eot_id|>",
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def build_tokenizer(out_dir: str) -> Any:
    """Byte-level BPE: the 256 byte symbols, then byte pairs, then triples up to 128,000."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)}
    merges: list[tuple[str, str]] = []

    def add(left: str, right: str) -> bool:
        if len(vocab) >= REGULAR_IDS:
            return False
        vocab[left + right] = len(vocab)
        merges.append((left, right))
        return True

    for a in symbols:
        for b in symbols:
            add(a, b)
    pairs = [a + b for a in symbols for b in symbols]
    for pair in pairs:
        if not all(add(pair, c) for c in symbols):
            break
    assert len(vocab) == REGULAR_IDS, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    names = [NAMED_SPECIALS.get(i, f"<|reserved_special_token_{i}|>") for i in range(SPECIAL_IDS)]
    tok.add_special_tokens([AddedToken(n, special=True) for n in names])
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id("<|eot_id|>") == REGULAR_IDS + 9
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 131072
    fast.save_pretrained(out_dir)
    return fast


def build_model(out_dir: str, shape: str) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        bos_token_id=REGULAR_IDS,
        eos_token_id=[REGULAR_IDS + 1, REGULAR_IDS + 9],
        pad_token_id=REGULAR_IDS + 1,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        rope_theta=500000.0,  # Llama 3's (transformers 5 files it under rope_parameters)
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out_dir, safe_serialization=True)
    return params


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python3 -m bench.gpu.mkmodel", description=__doc__)
    cli.add_argument("out_dir")
    cli.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    args = cli.parse_args(argv)
    t0 = time.monotonic()
    os.makedirs(args.out_dir, exist_ok=True)
    tok = build_tokenizer(args.out_dir)
    t1 = time.monotonic()
    params = build_model(args.out_dir, args.shape)
    t2 = time.monotonic()
    sample = "Hello world, héllo!"
    print(
        json.dumps(
            {
                "shape": args.shape,
                "params": params,
                "vocab": VOCAB,
                "tokenizer_s": round(t1 - t0, 1),
                "model_s": round(t2 - t1, 1),
                "files": sorted(os.listdir(args.out_dir)),
                "round_trip": tok.decode(tok(sample)["input_ids"]) == sample,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
