"""Make a tiny Llama-architecture model on disk: random weights, a byte-level BPE
tokenizer trained here on local text, and a chat template. Nothing is downloaded.

Run with the serving environment's interpreter: ``python make_model.py OUT_DIR``;
``--hidden 512 --layers 8 --max-positions 140000 --no-eos`` makes the GPU bench's model
(long enough for the 128k tier; without an end-of-sequence token it always writes the
requested number of tokens, so every trial's output length is exact).
"""

from __future__ import annotations

import glob
import os
import sysconfig

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Local text: the standard library's own Python sources."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:150]
    texts = []
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as handle:
            texts.append(handle.read())
    return texts


def main(
    out: str,
    hidden: int = 256,
    layers: int = 4,
    max_positions: int = 32768,
    eos: bool = True,
    dtype: str = "float32",
    device: str = "cpu",
) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|begin|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id if eos else None,
        torch_dtype=dtype,
    )
    # a large model is made in seconds on a GPU (``--device cuda``) and written in its
    # serving dtype (``--dtype bfloat16``: half the bytes to write and to load)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    if not eos:
        model.generation_config.eos_token_id = None
        # sampled, as the bench asks (temperature 1.0): greedy decoding of random weights
        # repeats one token, which the bench's validity rules rightly reject
        model.generation_config.do_sample = True
    model.save_pretrained(out, safe_serialization=True)
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--max-positions", type=int, default=32768)
    parser.add_argument("--no-eos", action="store_true")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", help="where the weights are made")
    a = parser.parse_args()
    main(a.out, a.hidden, a.layers, a.max_positions, not a.no_eos, a.dtype, a.device)
