"""A character-level tokenizer for the sandbox zoo, saved as a standard `PreTrainedTokenizerFast`.

    python -c "from harness.sandbox.tokenizer import make_tokenizer; print(make_tokenizer()('12+3'))"

One token per character of printable ASCII plus newline, and five special tokens. The chat template
renders `<|user|>…<|end|><|assistant|>`; `<|end|>` is the EOS, so a model learns to stop on it and
vLLM stops there without stop strings.
"""

from __future__ import annotations

import string

USER, ASSISTANT, SYSTEM, END = "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"
PAD, UNK = "<pad>", "<unk>"
SPECIALS = (PAD, UNK, END, USER, ASSISTANT, SYSTEM)
CHARS = "\n" + "".join(c for c in string.printable if c.isprintable())

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def vocab() -> dict[str, int]:
    tokens = list(SPECIALS) + list(CHARS)
    return {t: i for i, t in enumerate(tokens)}


def make_tokenizer():
    """A `PreTrainedTokenizerFast` over characters; `save_pretrained` writes a standard directory."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
