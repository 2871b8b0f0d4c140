"""Experiment configs: strict, frozen, every error at once with key paths and suggestions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.config.loading import load_experiment
from harness.config.schema import Experiment
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
    from harness.config.loading import read_yaml

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


# --- classes of values that validate nowhere -----------------------------------------------------


def _strict_models() -> list[type]:
    """Every strict config model: the experiment's and the task files'."""
    from harness.config.schema import Strict
    from harness.tasks import suite  # noqa: F401 (its task-file models subclass Strict)

    out, todo = [], [Strict]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in out if c is not Strict]


def _field_paths(model: type, prefix: str = "") -> list[tuple[str, object]]:
    """(key path with `[]` for list items, annotation) of every field under `model`."""
    from harness.config.loading import _unwrap

    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append((path, field.annotation))
        for sub in dict.fromkeys(_unwrap(field.annotation)):
            many = "tuple[" in str(field.annotation)
            out.extend(_field_paths(sub, f"{path}{'[]' if many else ''}."))
    return out


SEEDS = {  # every seed of an experiment: where a value goes in MINIMAL
    "generate.seed": ("generate", "seed"),
    "generate.seeds[]": ("generate", "seeds"),
    "evaluate.seed": ("evaluate", "seed"),
    "train.seeds[]": ("train", "seeds"),
    "analysis.seed": ("analysis", "seed"),
}


def test_every_seed_is_in_the_range_the_libraries_take(tmp_path):
    """numpy and accelerate's set_seed take 0 .. 2**32 - 1: a seed outside fails at validate,
    not in a training worker after the traces and evaluations were paid for."""
    from harness.config.schema import Experiment as Exp

    found = {p for p, _ in _field_paths(Exp) if p.rsplit(".", 1)[-1].removesuffix("[]") in
             ("seed", "seeds")}  # fmt: skip
    assert found == {p.removesuffix("[]") for p in SEEDS}, "a new seed: add it to SEEDS"
    for path, (section, key) in SEEDS.items():
        many = path.endswith("[]")
        for value, ok in ((2**32 - 1, True), (2**32, False), (-1, False)):
            data = {
                **MINIMAL,
                section: {**MINIMAL.get(section, {}), key: [value] if many else value},
            }
            if ok:
                Experiment.model_validate(data)
                continue
            with pytest.raises(UserError, match=rf"{section}\.{key}.*(greater|less) than"):
                load_experiment(write(tmp_path, data))


def test_every_float_of_every_config_model_is_finite():
    """nan and inf validate nowhere (a `0-nan` gap bin, an infinite device-hour price): every
    float field of the experiment's and the task files' models, a list's items included."""
    checked = 0
    for model in _strict_models():
        for name, field in model.model_fields.items():
            text = str(field.annotation)
            if "float" not in text:
                continue
            many = text.startswith("tuple[")
            for bad in (float("nan"), float("inf")):
                with pytest.raises(ValidationError) as e:
                    model.model_validate({name: [bad] if many else bad})
                kinds = {err["type"] for err in e.value.errors() if err["loc"][0] == name}
                assert "finite_number" in kinds, f"{model.__name__}.{name} takes {bad}"
            checked += 1
    assert checked >= 20  # the walk reached the models


DUPLICATES = {  # a list field given one entry twice, and what the error says
    "generate.stop": (("generate", "stop"), ["\n", "\n"]),
    "evaluate.stop": (("evaluate", "stop"), ["##", "##"]),
    "generate.seeds": (("generate", "seeds"), [1, 1]),
    "train.seeds": (("train", "seeds"), [1, 1]),
    "train.regimes": (("train", "regimes"), ["per_teacher", "per_teacher"]),
    "train.methods": (("train", "methods"), ["sft", "sft"]),
    "train.lora.target_modules": (("train", "lora"), {"target_modules": ["q_proj", "q_proj"]}),
    "train.budget.regimes": (("train", "budget"), {"regimes": ["per_teacher"] * 2}),
    "train.budget.align": (("train", "budget"), {"align": ["none", "none"]}),
    "analysis.delta_large": (("analysis", "delta_large"), ["big", "big"]),
    "analysis.delta_long": (("analysis", "delta_long"), ["big", "big"]),
    "analysis.families": (
        ("analysis", "families"),
        [{"name": "a", "tasks": ["x*"]}, {"name": "a", "tasks": ["y*"]}],
    ),
    "analysis.families[].tasks": (("analysis", "families"), [{"name": "a", "tasks": ["x", "x"]}]),
    "costs.throughput": (("costs", "throughput"), [{"model": "big", "generate": 1.0}] * 2),
    "costs.prices": (
        ("costs", "prices"),
        [{"model": "big", "input_per_million": 1, "output_per_million": 1}] * 2,
    ),
    "task_paths": ((None, "task_paths"), [".", "."]),
    "tasks": ((None, "tasks"), ["sandbox_addition", "sandbox_addition"]),
    "teachers": ((None, "teachers"), [MINIMAL["teachers"][0]] * 2),
    "students": ((None, "students"), [MINIMAL["students"][0]] * 2),
}
# lists whose entries are checked otherwise: gap_bins increase; a mix names each teacher once
# (`validate`'s checks, with the total weight to give)
OTHERWISE = {"analysis.gap_bins", "train.mix"}


@pytest.mark.parametrize("path", list(DUPLICATES))
def test_a_list_entry_given_twice_is_an_error(path):
    (section, key), value = DUPLICATES[path]
    data = dict(MINIMAL)
    if section is None:
        data[key] = value
    else:
        data[section] = {**data.get(section, {}), key: value}
    with pytest.raises(ValidationError, match=r"more than once|at most once|itself|unique"):
        Experiment.model_validate(data)


def test_every_list_of_the_experiment_refuses_duplicates():
    """A new list field is in DUPLICATES (its duplicate refused) or says how it is checked."""
    lists = {p.removesuffix("[]") for p, t in _field_paths(Experiment) if "tuple[" in str(t)}
    lists = {p for p in lists if not p.startswith(("teachers[].", "students[].", "tasks[]."))}
    missing = sorted(lists - set(DUPLICATES) - OTHERWISE)
    assert not missing, f"lists without a duplicate check: {missing}"


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("analysis", "bootstrap_samples", 10**12), ("analysis", "bootstrap_samples", 100_001)],
)
def test_absurd_sizes_are_refused(tmp_path, section, key, value):
    data = {**MINIMAL, section: {key: value}}
    with pytest.raises(UserError, match=rf"{section}\.{key}: Input should be less than"):
        load_experiment(write(tmp_path, data))


# --- racing --------------------------------------------------------------------------------------

RACE = {"seeds": [0, 1, 2, 3, 4], "replicates": "paired"}


def test_a_race_is_off_by_default_and_keeps_every_key(tmp_path):
    from harness.workflow import grid

    plain = _replicates(tmp_path, {"seeds": [0, 1, 2, 3, 4]}, RACE)
    raced = _replicates(
        tmp_path,
        {"seeds": [0, 1, 2, 3, 4]},
        {**RACE, "race": {"min_replicates": 3, "max_replicates": 5}},
    )
    assert plain.train.race is None and raced.train.race is not None
    assert [c.key for c in grid.expand(plain).cells] == [c.key for c in grid.expand(raced).cells]


def test_a_race_needs_its_minimum_at_or_below_its_maximum(tmp_path):
    with pytest.raises(UserError) as e:
        _replicates(tmp_path, {}, {"race": {"min_replicates": 4, "max_replicates": 3}})
    assert "train.race: min_replicates 4 is above max_replicates 3; give a minimum" in str(e.value)


@pytest.mark.parametrize(
    ("race", "analysis", "needle"),
    [
        ({"min_replicates": 3, "max_replicates": 4}, {},
         "train.race.max_replicates: 4, but generate.seeds lists 5 trace draw(s)"),
        ({"min_replicates": 2, "max_replicates": 5}, {},
         "train.race.min_replicates: 2 is below analysis.min_replicates 3"),
        ({"min_replicates": 2, "max_replicates": 5}, {"min_replicates": 2}, None),
    ],
)  # fmt: skip
def test_validate_refuses_a_race_the_grid_cannot_run(tmp_path, race, analysis, needle):
    from harness.workflow import checks

    data = {**MINIMAL, "generate": {"seeds": [0, 1, 2, 3, 4]},
            "train": {**MINIMAL["train"], **RACE, "race": race}, "analysis": analysis}  # fmt: skip
    problems = checks.problems(load_experiment(write(tmp_path, data), check_tasks=False))
    assert problems == ([] if needle is None else [p for p in problems if needle in p])
    assert len(problems) == (0 if needle is None else 1)
