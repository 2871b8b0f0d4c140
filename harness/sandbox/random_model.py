"""A random-init Llama with the sandbox character tokenizer: the engine-level fixture of tests and
benchmarks (where what matters is the model's shape and speed, not what it knows)."""

from __future__ import annotations

from pathlib import Path


def random_llama(
    out: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    intermediate: int | None = None,
    head_dim: int = 32,
    max_positions: int = 512,
    tie_embeddings: bool = True,
    eos_boost: float = 1.0,
    seed: int = 0,
) -> Path:
    """Save a random Llama (`hidden // head_dim` heads, MLP `intermediate`, default 2 x hidden)
    and the char tokenizer to `out`; loadable by transformers and vLLM.

    Initialised wider than the default 0.02 (std 0.1): sharper logits, so no near-ties between
    engines, and LoRA can move the loss far. `eos_boost` scales the EOS embedding row, so greedy
    decoding stops on EOS for some prompts and runs to max_tokens for others.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.sandbox.tokenizer import make_tokenizer

    tok = make_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // head_dim,
        num_key_value_heads=hidden // head_dim,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    if eos_boost != 1.0:
        with torch.no_grad():
            model.model.embed_tokens.weight[tok.eos_token_id] *= eos_boost
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
