"""Experiment configs: strict, frozen, every error at once with key paths and suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.config.schema import Experiment, load_experiment
from harness.errors import UserError

REPO = Path(__file__).resolve().parents[3]

MINIMAL = {
    "name": "t",
    "teachers": [{"name": "big", "path": "sandbox:teacher-l"}],
    "students": [{"name": "small", "path": "sandbox:student-s"}],
    "tasks": ["sandbox_addition"],
    "train": {"max_steps": 10},
}


def write(tmp_path, data) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def test_every_shipped_config_validates():
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert configs, "configs/ is empty"
    for path in configs:
        exp = load_experiment(path)
        assert exp.teachers and exp.students and exp.tasks


def test_misspelt_key_names_path_and_suggestion(tmp_path):
    data = {**MINIMAL, "teachers": [{"name": "big", "path": "x", "chat_templte": False}]}
    data["genrate"] = {"n": 2}
    with pytest.raises(UserError) as e:
        load_experiment(write(tmp_path, data), check_tasks=False)
    msg = str(e.value)
    assert "teachers[0].chat_templte: unknown key; did you mean 'chat_template'?" in msg
    assert "genrate: unknown key; did you mean 'generate'?" in msg  # both errors reported at once
    assert str(tmp_path / "exp.yaml") in msg


def test_nested_typo_and_type_errors(tmp_path):
    data = {**MINIMAL, "train": {"max_steps": "many", "lora": {"alpah": 8}}}
    with pytest.raises(UserError) as e:
        load_experiment(write(tmp_path, data), check_tasks=False)
    msg = str(e.value)
    assert "train.lora.alpah: unknown key; did you mean 'alpha'?" in msg
    assert "train.max_steps" in msg


def test_frozen_and_budget_rules(tmp_path):
    exp = load_experiment(write(tmp_path, MINIMAL), check_tasks=False)
    with pytest.raises(ValidationError):
        exp.name = "other"  # frozen
    bad = {**MINIMAL, "train": {"max_steps": 5, "epochs": 1}}
    with pytest.raises(UserError, match="exactly one of max_steps or epochs"):
        load_experiment(write(tmp_path, bad), check_tasks=False)
    greedy_n = {**MINIMAL, "evaluate": {"n": 4}}
    with pytest.raises(UserError, match="greedy needs n: 1"):
        load_experiment(write(tmp_path, greedy_n), check_tasks=False)


def test_trust_remote_code_is_off_by_default(tmp_path):
    exp = load_experiment(write(tmp_path, MINIMAL), check_tasks=False)
    assert all(not m.trust_remote_code for m in (*exp.teachers, *exp.students))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: [unclosed", "malformed YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        ("!!python/object/apply:os.system ['echo hi']", "malformed YAML"),
    ],
)
def test_malformed_yaml(tmp_path, text, needle):
    with pytest.raises(UserError, match=needle):
        load_experiment(write(tmp_path, text))


def test_non_utf8_file(tmp_path):
    p = tmp_path / "exp.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(UserError, match="not UTF-8"):
        load_experiment(p)


def test_duplicate_model_names(tmp_path):
    data = {**MINIMAL, "students": [{"name": "big", "path": "y"}]}
    with pytest.raises(UserError, match="unique"):
        load_experiment(write(tmp_path, data), check_tasks=False)


def test_unknown_task_is_reported_with_suggestion(tmp_path):
    data = {**MINIMAL, "tasks": ["gsm8kk"]}
    with pytest.raises(
        UserError, match=r"tasks\[0\].name: unknown task 'gsm8kk'; did you mean 'gsm8k'"
    ):
        load_experiment(write(tmp_path, data))


def test_model_name_cannot_traverse(tmp_path):
    data = {**MINIMAL, "teachers": [{"name": "../../etc", "path": "x"}]}
    with pytest.raises(UserError, match=r"teachers\[0\].name"):
        load_experiment(write(tmp_path, data), check_tasks=False)


def test_task_refs_accept_names_and_mappings(tmp_path):
    data = {**MINIMAL, "tasks": ["sandbox_addition", {"name": "gsm8k", "test_limit": 5}]}
    exp: Experiment = load_experiment(write(tmp_path, data), check_tasks=False)
    assert [t.name for t in exp.tasks] == ["sandbox_addition", "gsm8k"]
    assert exp.task("gsm8k").test_limit == 5


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    from harness.config.schema import read_yaml

    path = tmp_path / "x.yaml"
    path.write_text("a: 1\nb:\n  c: 2\n  d: 3\n  c: 4\n")
    with pytest.raises(UserError, match=r"x.yaml: duplicate key 'c' \(lines 3 and 5\)"):
        read_yaml(path)
    # a merge key's values may be overridden: that is what `<<` is for
    path.write_text("base: &b {n: 1, m: 2}\nuse:\n  <<: *b\n  n: 3\n")
    assert read_yaml(path)["use"] == {"n": 3, "m": 2}


def _replicates(tmp_path, generate: dict, train: dict):
    data = {**MINIMAL, "generate": generate, "train": {**MINIMAL["train"], **train}}
    return load_experiment(write(tmp_path, data), check_tasks=False)


def test_trace_seeds_and_replicates(tmp_path):
    plain = _replicates(tmp_path, {"seed": 4}, {"seeds": [0, 1]})
    assert plain.generate.seeds is None and plain.generate.trace_seeds == (4,)
    assert plain.train.replicates == "crossed" and plain.replicates() == [(4, 0), (4, 1)]
    crossed = _replicates(tmp_path, {"seeds": [3, 5]}, {"seeds": [0, 1]})
    assert crossed.replicates() == [(3, 0), (3, 1), (5, 0), (5, 1)]
    paired = _replicates(tmp_path, {"seeds": [3, 5]}, {"seeds": [0, 1], "replicates": "paired"})
    assert paired.replicates() == [(3, 0), (5, 1)]


@pytest.mark.parametrize(
    ("generate", "train", "needle"),
    [
        ({"seed": 2, "seeds": [0, 1]}, {}, "generate: give seed or seeds, not both"),
        ({"seeds": [0, 1, 0]}, {}, "generate.seeds: [0] given more than once"),
        ({"seeds": []}, {}, "generate.seeds: give at least one seed"),
        ({}, {"seeds": [1, 1]}, "train.seeds: [1] given more than once"),
        ({}, {"replicates": "nested"}, "train.replicates: Input should be 'crossed' or 'paired'"),
        (
            {"seeds": [0, 1]},
            {"seeds": [0, 1, 2], "replicates": "paired"},
            "train.replicates: paired trains the k-th trace draw",
        ),
        ({}, {"seeds": [0, 1], "replicates": "paired"}, "1 trace draw(s) and 2 training seed(s)"),
    ],
)
def test_replicate_errors_name_the_field_and_the_fix(tmp_path, generate, train, needle):
    with pytest.raises(UserError) as e:
        _replicates(tmp_path, generate, train)
    assert needle in str(e.value) and str(tmp_path / "exp.yaml") in str(e.value)
