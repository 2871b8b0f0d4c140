"""Training that fits: the chunked linear cross-entropy gives the plain loss and its gradients
without the whole batch's logits; gradient checkpointing is chosen by size and changes nothing
but memory. A real (random-init) Llama and a real accelerate Accelerator on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.config.schema import TrainConfig
from harness.stages import train_worker
from harness.workflow import estimate

VOCAB = 997


def _model(tie: bool = False, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tie,
        initializer_range=0.1,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).float()


def _batch(seed: int = 1) -> dict:
    """Two rows, right-padded, the first 5 tokens of each a prompt (label -100)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    ids[1, 17:] = 0
    labels = ids.clone()
    labels[:, :5] = -100
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _plain(model, b: dict) -> torch.Tensor:
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    targets = F.pad(b["labels"][:, 1:], (0, 1), value=-100).flatten()
    return F.cross_entropy(logits.flatten(0, 1).float(), targets, reduction="sum")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def acc():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_chunked_loss_and_gradients_equal_the_plain_ones(acc, monkeypatch, tie, checkpointing):
    b = _batch()
    n_targets = int((b["labels"][:, 1:] != -100).sum())
    monkeypatch.setattr(train_worker, "CHUNK_BYTES", 4 * VOCAB * 5)  # 5 positions a chunk
    reference, model = _model(tie), _model(tie)
    model.load_state_dict(reference.state_dict())
    if checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    reference.train(), model.train()
    rows: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[-2]))

    plain = _plain(reference, b)
    plain.backward()
    chunked = train_worker.completion_ce(acc, model, b)
    chunked.backward()
    hook.remove()

    assert chunked.dtype == torch.float32
    assert torch.allclose(chunked, plain, rtol=1e-5), (chunked, plain)
    # the model's own forward computed no logits; each chunk at most 5 positions (twice: the
    # forward, and its recomputation in the backward pass)
    assert rows[0] == 0 and max(rows[1:]) <= 5
    assert sum(rows[1:]) == 2 * n_targets
    want, got = _grads(reference), _grads(model)
    assert set(got) == set(want) and len(got) == len(list(model.parameters()))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)


def test_chunked_loss_trains_lora_like_the_plain_loss(acc, monkeypatch):
    import peft

    monkeypatch.setattr(train_worker, "CHUNK_BYTES", 4 * VOCAB * 7)
    b = _batch(seed=3)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    models = []
    for _ in range(2):
        torch.manual_seed(5)  # the same LoRA initialisation
        models.append(peft.get_peft_model(_model(), lora))
    for m in models:  # B starts at zero: move it, so A's gradient is not zero
        for n, p in m.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(7))
    _plain(models[0], b).backward()
    train_worker.completion_ce(acc, models[1], b).backward()
    want, got = _grads(models[0]), _grads(models[1])
    assert set(got) == set(want) and all("lora_" in n for n in got) and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_gradient_checkpointing_auto_is_on_from_1b_parameters():
    auto, on, off = (
        TrainConfig(max_steps=1, gradient_checkpointing=v) for v in ("auto", True, False)
    )
    assert not estimate.checkpointing(auto, 494_032_768)  # Qwen2.5-0.5B
    assert estimate.checkpointing(auto, 1_543_714_304)  # Qwen2.5-1.5B
    assert estimate.checkpointing(on, 10) and not estimate.checkpointing(off, 10**10)


def test_gradient_checkpointing_is_not_in_the_adapter_key(tmp_path):
    from helpers import sandbox_grid

    from harness.config.loading import parse
    from harness.config.schema import Experiment
    from harness.workflow import grid

    keys = []
    for value in ("auto", True):
        config = sandbox_grid("gc", tmp_path, gradient_checkpointing=value)
        g = grid.expand(parse(Experiment, config, "gc.yaml"))
        keys.append(sorted(c.key for c in g.unique() if c.kind == "adapter"))
    assert keys[0] and keys[0] == keys[1]
