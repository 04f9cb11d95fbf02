"""Write a tiny random-weight Llama and a locally trained byte-level BPE tokenizer to OUTDIR.

Nothing is downloaded; run it with the vLLM venv's python (it needs torch, transformers and tokenizers).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

SEED = 0
VOCAB_SIZE = 2048
MAX_POSITIONS = 4096
# A fixed, sorted slice of the interpreter's own sources: the same corpus on every run of the same Python.
CORPUS_FILES = 200
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def corpus_paths() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted(stdlib.glob("*.py"))[:CORPUS_FILES]]


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        # Every byte gets a token, so any text (not only Python) encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_paths(), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=MAX_POSITIONS
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    # float32 weights: engines serve with --dtype float32, which keeps greedy output identical across engines.
    return LlamaForCausalLM(cfg).to(torch.float32)


def cfg_summary(model: LlamaForCausalLM) -> str:
    c = model.config
    return f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, max positions {c.max_position_embeddings}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    hf_logging.disable_progress_bar()
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save_pretrained(out)
    model = build_model(tok)
    model.save_pretrained(out, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: vocab {len(tok)}, {n_params} parameters, {cfg_summary(model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
