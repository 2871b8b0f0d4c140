"""Reading an experiment YAML into the schema, with a YAML loader that reports every error.

    cotgap validate configs/sandbox.yaml

A misspelt key is reported with its file, key path and the nearest valid key; a key given twice
in one mapping is an error naming both lines. Safe YAML only: YAML holds values and names, never
code. Every relative path in an experiment file is taken relative to that file, so a command
means the same from any working directory: `results_dir`, `data_dir`, `task_paths`,
`train.accelerate_config`, a model `path` that names a directory there (or starts with `./` or
`../`) and the file of `gguf:<file>.gguf`. (Tracking paths are under <results_dir>/<name>.) An
experiment's task names are checked against the task YAMLs of `task_dirs()`
(harness/config/task_paths.py).
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.config.schema import EngineSettings, Experiment, ModelSpec, OpenAIEndpoint, Strict
from harness.config.task_paths import include_task_paths, task_names
from harness.errors import UserError


def _unwrap(annotation: Any) -> list[Any]:
    """The model classes an annotation can hold (through Optional, tuple[...], list[...], unions)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, tuple, list, dict, typing.Annotated):
        out = []
        for arg in typing.get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


_ENGINE_TAGS: dict[str, type[BaseModel]] = {"local": EngineSettings, "openai": OpenAIEndpoint}


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the last key of `loc`."""
    current: type[BaseModel] | None = root
    for prev, part in zip((None, *loc), loc[:-1], strict=False):
        if current is None:
            return None
        if isinstance(part, int):
            continue
        if prev == "engine" and part in _ENGINE_TAGS:  # the kind of engine the entry chose
            current = _ENGINE_TAGS[part]
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        candidates = _unwrap(field.annotation)
        current = candidates[0] if candidates else None
    return current


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for prev, part in zip((None, *loc), loc, strict=False):
        if prev == "engine" and part in _ENGINE_TAGS:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith("function-"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def format_validation_error(
    err: ValidationError,
    source: str,
    root: type[BaseModel],
    names: typing.Mapping[str, str] | None = None,
) -> str:
    """One line per error: `source: key path: problem`. `names` renames key paths (list indices
    written `[]`), e.g. to the command-line flag a value came from."""
    lines = []
    errors = [
        (tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))), e)
        for e in err.errors()
    ]
    for loc, e in errors:
        path = _key_path(loc)
        if names:
            generic = re.sub(r"\[\d+\]", "[]", path)
            path = names.get(generic) or names.get(generic.removesuffix("[]")) or path
        if e["type"] == "too_short" and any(
            other[: len(loc)] == loc and len(other) > len(loc) for other, _ in errors
        ):
            continue  # the list is empty only because its invalid items (reported) were dropped
        if e["type"] in ("tuple_type", "list_type"):
            got = type(e.get("input")).__name__
            lines.append(f"{source}: {path}: expected a list ([a, b] or '- a' lines), got {got}")
        elif e["type"] in ("model_type", "dict_type"):
            got = type(e.get("input")).__name__
            lines.append(f"{source}: {path}: expected a mapping ('key: value' lines), got {got}")
        elif e["type"] == "too_short":
            lines.append(f"{source}: {path}: needs at least {e['ctx']['min_length']} item(s)")
        elif e["type"] == "extra_forbidden":
            owner = _model_at(root, loc)
            valid = sorted(owner.model_fields) if owner else []
            near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
            lines.append(f"{source}: {path}: unknown key; {hint}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {path}: {msg}")
    return "\n".join(lines)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int):
        super().__init__(f"duplicate key {key!r} (lines {first} and {again}); keep one of them")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one
    silently, so a second `train:` block appended to a file would win unnoticed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != line:
                raise _DuplicateKey(key, first, line)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> Any:
    """The data of a YAML file (experiment, task, few-shot file): safe tags only, no duplicate keys."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file; give the path of a YAML file.")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{p}: not UTF-8 text (byte {e.start}); save it as UTF-8.") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as e:
        raise UserError(f"{p}: {e}.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{p}:{where}: malformed YAML: {problem}.") from None


def parse(
    model: type[Strict], data: Any, source: str, names: typing.Mapping[str, str] | None = None
) -> Any:
    """`data` validated as `model`; errors name `source` and the key paths (or `names` of them)."""
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise UserError(f"{source}: expected a mapping of keys at the top level, got {got}.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, source, model, names)) from None


def _relative_to(exp: Experiment, base: Path) -> Experiment:
    """`exp` with its relative paths taken against `base`, the experiment file's directory."""

    def under(p: str) -> str:
        return os.path.normpath(base / Path(p).expanduser())

    def model_path(p: str) -> str:
        if p.startswith("gguf:") and (p.endswith(".gguf") or p.startswith(("gguf:.", "gguf:~"))):
            return "gguf:" + under(p.removeprefix("gguf:"))
        # absolute: a folder written as a relative path stays one even where it does not exist
        # (a relative result would read as a hub id org/name and fail at run time, not validate);
        # so does org/name where `org` is a folder next to the config (models/my-studnet, a typo)
        if p.startswith(("./", "../", "~")) or (":" not in p and (base / p).is_dir()):
            return os.path.abspath(under(p))
        if ":" not in p and len(Path(p).parts) > 1 and (base / Path(p).parts[0]).is_dir():
            return os.path.abspath(under(p))
        return p

    def models_(specs: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        return tuple(
            m if m.path is None else m.model_copy(update={"path": model_path(m.path)})
            for m in specs
        )

    train = exp.train
    if train.accelerate_config is not None:
        train = train.model_copy(update={"accelerate_config": under(train.accelerate_config)})
    return exp.model_copy(
        update={
            "results_dir": under(exp.results_dir),
            "data_dir": under(exp.data_dir) if exp.data_dir is not None else None,
            "task_paths": tuple(under(p) for p in exp.task_paths),
            "teachers": models_(exp.teachers),
            "students": models_(exp.students),
            "train": train,
        }
    )


def load_experiment(path: str | Path, check_tasks: bool = True) -> Experiment:
    """Read and validate an experiment YAML; every error is reported at once: the fields', and
    the task names beside them (read from the YAML as written where a field is wrong). Relative
    paths are resolved against the file's directory (`_relative_to`)."""
    raw = read_yaml(path)
    try:
        exp = _relative_to(parse(Experiment, raw, str(path)), Path(path).parent)
    except UserError as e:
        more = _raw_task_problems(raw, path) if check_tasks else []
        if more:
            raise UserError("\n".join([str(e), *more])) from None
        raise
    missing = [
        f"{path}: task_paths[{i}]: no folder {p}; create it or fix the path"
        for i, p in enumerate(exp.task_paths)
        if not Path(p).is_dir()
    ]
    if missing:
        raise UserError("\n".join(missing))
    include_task_paths(exp.task_paths)
    if check_tasks:
        problems = _unknown_tasks([t.name for t in exp.tasks], path)
        if problems:
            raise UserError("\n".join(problems))
    return exp


def _unknown_tasks(names: list[str], path: str | Path) -> list[str]:
    """One error per task name that no task folder holds, with the nearest known name."""
    known = task_names()
    problems = []
    for i, name in enumerate(names):
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else "see `cotgap ls tasks`"
            problems.append(f"{path}: tasks[{i}].name: unknown task {name!r}; {hint}")
    return problems


def _raw_task_problems(raw: Any, path: str | Path) -> list[str]:
    """The unknown task names of a config whose fields did not validate, read from the YAML as
    written (each task a name or a mapping with `name`; `task_paths` taken relative to the
    file, only the folders that exist), so that validate names them beside the fields' errors.
    Best effort: anything it cannot read is left to the next validate."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tasks"), list):
        return []
    folders = raw.get("task_paths") or []
    if isinstance(folders, list):
        base = Path(path).parent
        found = [base / Path(p).expanduser() for p in folders if isinstance(p, str)]
        include_task_paths([d for d in found if d.is_dir()])
    names = [t if isinstance(t, str) else t.get("name") if isinstance(t, dict) else None
             for t in raw["tasks"]]  # fmt: skip
    if not all(isinstance(n, str) for n in names):
        return []
    return _unknown_tasks([str(n) for n in names], path)
