"""Model sizes counted from safetensors headers, without loading weights or touching the hub."""

from __future__ import annotations

import pytest

from harness.config.schema import ModelSpec
from harness.models import sources as models
from harness.sandbox.random_model import random_llama


@pytest.mark.parametrize("tied", [True, False])
def test_param_count_equals_the_loaded_models(tmp_path, tied):
    from transformers import AutoModelForCausalLM

    d = random_llama(tmp_path / "m", hidden=64, layers=3, tie_embeddings=tied)
    loaded = AutoModelForCausalLM.from_pretrained(d)
    want = sum(p.numel() for p in loaded.parameters())  # tied weights counted once
    assert models.param_count(ModelSpec(name="m", path=str(d))) == want


def test_param_count_is_none_when_the_model_is_not_here(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert models.param_count(ModelSpec(name="e", path=str(tmp_path / "empty"))) is None
    # a hub id absent from the local cache: no download, no error, just unknown
    assert models.param_count(ModelSpec(name="h", path="nobody-here/no-such-model-xyz")) is None
