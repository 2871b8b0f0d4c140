"""How a student sees a training example: its tokenizer, prompt + completion as token ids (the
prompt rendered as evaluation renders it), and a padded batch with the loss on the completion.
Shared by the training sets (harness/stages/dataset.py), training (harness/stages/train_worker.py) and the screen
(harness/stages/screen.py), which must agree token for token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.errors import UserError


def load_tokenizer(model_dir: str, chat_template: bool, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if tok.eos_token_id is None:
        raise UserError(
            f"{model_dir}: the tokenizer has no EOS token; a student must learn to stop."
        )
    if chat_template and not tok.chat_template:
        raise UserError(
            f"{model_dir}: no chat template in the tokenizer; set chat_template: false."
        )
    return tok


def encode(tok: Any, prompt: str, completion: str, chat_template: bool) -> tuple[list[int], int]:
    """Token ids of prompt + completion + EOS as the student sees them, and how many are prompt.

    The prompt is rendered as evaluation renders it (chat template, or raw text with the tokenizer's
    own special tokens); the completion is tokenized on its own so the boundary is exact."""
    if chat_template:
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = tok(prompt)["input_ids"]
    completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
    return [*prompt_ids, *completion_ids, tok.eos_token_id], len(prompt_ids)


def collate(data: Sequence[tuple[list[int], int]], indices: Sequence[int], pad_id: int) -> dict:
    """Right-padded input_ids and attention_mask; labels are -100 on prompt and padding."""
    import torch

    width = max(len(data[i][0]) for i in indices)
    ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for row, i in enumerate(indices):
        seq, n_prompt = data[i]
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, n_prompt : len(seq)] = torch.tensor(seq[n_prompt:])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
