"""The task suite: tasks/*.yaml -> items and prompts (scoring them: harness/tasks/scoring.py).

    cotgap ls tasks
    cotgap ls items gsm8k --split test --data-dir ../shared/data

A task YAML names its source twice: a hub dataset (id, config, revision, splits) and the original
files as laid out under a data dir (../shared/data), with a field mapping, an answer type, an
extractor and prompt templates; or once, a sandbox generator (harness/sandbox/tasks.py). Each kind
of source is one row of `_SOURCES`. A source with a single pool of items (`all`) is divided into
train/test by a seeded hash of each question, so the same questions land in the same split
whichever copy was read. Without a data dir (argument or COTGAP_DATA_DIR) items come from the hub.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import os
import random
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO, cast

from pydantic import Field, model_validator

from harness.config.loading import parse, read_yaml
from harness.config.schema import PromptStyle, Strict
from harness.config.task_paths import task_dirs, task_file, task_names, tasks_dir
from harness.errors import UserError
from harness.sandbox import tasks as sandbox
from harness.store import OUT_FIX, atomic_write_text, jsonl_text
from harness.tasks import answers

SplitName = Literal["train", "test", "all"]
SPLITS = ("train", "test", "all")
AnswerFrom = Literal[
    "plain", "after_hashes", "boxed", "target_scores", "choice_scores", "yes_no_bool",
    "leading_number",
]  # fmt: skip


# --- the YAML schema ---------------------------------------------------------------------------------


class Fields(Strict):
    """Where a row keeps each part of an item: dotted paths ("question.stem", "lSolutions.0")."""

    id: str | None = None
    question: str | tuple[str, ...]
    answer: str
    answer_from: AnswerFrom = "plain"
    rationale: str | None = None
    choices: str | None = None
    meta: tuple[str, ...] = ()


class HubSource(Strict):
    id: str
    config: str | None = None
    revision: str = "main"
    splits: dict[SplitName, tuple[str, ...]]
    fields: Fields | None = Field(
        None, description="when the hub copy names its fields differently"
    )


class FileSource(Strict):
    format: Literal["jsonl", "json", "json_examples", "asdiv_xml"]
    splits: dict[SplitName, tuple[str, ...]]
    keep_ids: tuple[str, ...] = Field((), description="files listing the ids to keep, one per line")
    optional: tuple[str, ...] = Field(
        (),
        description="files of `splits` read when the data dir holds them; a split missing one "
        "is not held to its `sizes`",
    )


class SandboxSource(Strict):
    generator: Literal["addition", "sums", "expressions", "last_letters", "coin_flip"]
    n_train: int = Field(gt=0)
    n_test: int = Field(gt=0)
    seed: int = 0


class Source(Strict):
    hub: HubSource | None = None
    files: FileSource | None = None
    sandbox: SandboxSource | None = None
    no_hub: str | None = Field(None, description="why there is no hub source")

    @model_validator(mode="after")
    def _one_kind(self) -> Source:
        if self.sandbox is not None:
            if self.hub or self.files:
                raise ValueError("a sandbox source has no hub or files")
            return self
        if self.files is None:
            raise ValueError(
                "give source.files (the original files under a data dir) or source.sandbox"
            )
        if self.hub is None and not self.no_hub:
            raise ValueError("give source.hub, or source.no_hub saying why there is none")
        keys = set(self.files.splits)
        if keys not in ({"train", "test"}, {"all"}):
            raise ValueError("source splits are either train and test, or all (divided by `split`)")
        if self.hub is not None and set(self.hub.splits) != keys:
            raise ValueError("source.hub.splits must name the same splits as source.files.splits")
        listed = {p for paths in self.files.splits.values() for p in paths}
        if set(self.files.optional) - listed:
            raise ValueError("source.files.optional names files that source.files.splits lists")
        return self


class SplitSpec(Strict):
    """How a single pool (`all`) is divided: train:test ratio, seed of the question hash."""

    ratio: tuple[int, int] = (3, 2)
    seed: int = 1234

    @model_validator(mode="after")
    def _positive(self) -> SplitSpec:
        if min(self.ratio) <= 0:
            raise ValueError("split.ratio needs two positive parts, e.g. [3, 2]")
        return self


class Prompt(Strict):
    zero_shot_cot: str
    few_shot_cot: str = "{fewshot}Q: {question}\nA:"
    exemplar: str = "Q: {question}\nA: {answer}\n\n"
    choices: str = "{question} Answer choices: {choices}."


class FewShotRef(Strict):
    file: str | None = Field(None, description="YAML of exemplars, relative to the tasks dir")
    data_file: str | None = Field(
        None,
        description="BBH cot-prompts text file, relative to the data dir; the package ships a "
        "copy under the tasks dir, read when the data dir has none",
    )

    @model_validator(mode="after")
    def _one(self) -> FewShotRef:
        if (self.file is None) == (self.data_file is None):
            raise ValueError("fewshot needs exactly one of file or data_file")
        return self


class Exclusion(Strict):
    """A source row left out of the task, by its position in the source, and why."""

    index: int = Field(ge=0, description="source_index of the row (its position in the pool)")
    reason: str


class Scoring(Strict):
    """How the task compares and reads answers beyond its answer type's own rules."""

    list_order: Literal["any", "as_given"] = Field(
        "any", description="math: whether a bare list (18, 14, 7) must be in the gold's order"
    )
    units: Literal["keep", "strip"] = Field(
        "keep", description="math: strip a unit written after a value (5 \\text{ cm} is 5)"
    )
    reasoning_ends: tuple[str, ...] = Field(
        (),
        description="ends of a reasoning part, beside the built-in ones (answers.REASONING_ENDS)",
    )
    closing_sentence: bool = Field(
        True,
        description="with no answer statement, the flexible reading takes the answer from the "
        "closing sentence before the last candidate anywhere (the strict reading gives none)",
    )


class TaskSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]{0,63}$")
    version: int = Field(ge=1)
    description: str
    splits_note: str = Field(description="what train and test are for this task")
    answer_type: Literal[answers.ANSWER_TYPES]  # type: ignore[valid-type]
    extractor: str
    headline: Literal["strict", "flexible"]
    source: Source
    fields: Fields | None = None
    shuffle_choices: bool = False
    split: SplitSpec | None = None
    train_excludes_test: bool = Field(
        False, description="train leaves out every question test holds (same text up to spaces)"
    )
    sizes: dict[SplitName, int] = {}
    exclude: tuple[Exclusion, ...] = Field((), description="rows left out, with the reason")
    prompt: Prompt
    fewshot: FewShotRef | None = None
    scoring: Scoring = Scoring()

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        ex = answers.EXTRACTORS.get(self.extractor)
        if ex is None:
            raise ValueError(
                f"unknown extractor {self.extractor!r}; valid: {sorted(answers.EXTRACTORS)}"
            )
        if self.answer_type not in ex.answer_types:
            raise ValueError(f"extractor {ex.name!r} cannot score answer_type {self.answer_type!r}")
        if self.source.sandbox is not None:
            if self.fields or self.split:
                raise ValueError("a sandbox task has no fields or split: the generator makes both")
        else:
            if self.fields is None:
                raise ValueError("fields: required for hub and file sources")
            pooled = self.source.files is not None and set(self.source.files.splits) == {"all"}
            if pooled != (self.split is not None):
                raise ValueError(
                    "split: required when the source has one pool (all), else not allowed"
                )
            if pooled and self.train_excludes_test:
                raise ValueError("train_excludes_test needs a source with train and test splits")
        for key, allowed in [
            ("zero_shot_cot", {"question"}),
            ("few_shot_cot", {"fewshot", "question"}),
            ("exemplar", {"question", "answer"}),
            ("choices", {"question", "choices"}),
        ]:
            template = getattr(self.prompt, key)
            unknown = set(re.findall(r"\{(\w+)\}", template)) - allowed
            if unknown or "{question}" not in template:
                raise ValueError(
                    f"prompt.{key}: placeholders are {sorted(allowed)}; got {template!r}"
                )
        return self

    @property
    def source_version(self) -> int | None:
        """The version of the code that makes the items (the sandbox generators); None for data."""
        return sandbox.VERSION if self.source.sandbox is not None else None


class Exemplar(Strict):
    question: str
    answer: str


class FewShotFile(Strict):
    source: str = Field(description="where the exemplars come from (provenance)")
    preamble: str = ""
    exemplars: tuple[Exemplar, ...] = Field(min_length=1)


@dataclass(frozen=True)
class Item:
    """One question of a task: `question` as the prompt shows it, `gold` in canonical form."""

    id: str
    source_index: int
    question: str
    gold: str
    meta: dict = field(default_factory=dict, compare=False)


# --- finding and reading task files -------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _load_task_file(path: str, mtime_ns: int) -> TaskSpec:
    spec: TaskSpec = parse(TaskSpec, read_yaml(path), path)
    if spec.name != Path(path).stem:
        raise UserError(f"{path}: name: {spec.name!r} differs from the file name; make them equal.")
    return spec


def load_task(name: str) -> TaskSpec:
    path = task_file(name) if re.fullmatch(r"[a-z0-9][a-z0-9_]{0,63}", name) else None
    if path is None:
        known = task_names()
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"did you mean {near[0]!r}?" if near else "see `cotgap ls tasks`"
        raise UserError(
            f"unknown task {name!r} (tasks are the *.yaml files in "
            f"{', '.join(map(str, task_dirs()))}; COTGAP_TASK_PATH adds folders); {hint}"
        )
    return _load_task_file(str(path), path.stat().st_mtime_ns)


def task_spec(task: TaskSpec | str) -> TaskSpec:
    """A task's spec, loaded when given by name."""
    return task if isinstance(task, TaskSpec) else load_task(task)


def _sizes(spec: TaskSpec) -> dict[str, int]:
    """Items each split has (tasks/<name>.yaml `sizes`, or what the sandbox generator makes)."""
    sb = spec.source.sandbox
    return {"train": sb.n_train, "test": sb.n_test} if sb else {k: v for k, v in spec.sizes.items()}


def split_sizes(task: TaskSpec | str) -> dict[str, int]:
    """Items each split of a task has, from its YAML alone (no data file is read)."""
    return _sizes(task_spec(task))


def counted_sizes(task: TaskSpec | str, data_dir: str | Path | None) -> dict[str, int]:
    """Items of each split: the YAML's (`split_sizes`), else, for a task read from local files
    alone (no hub source), its train and test items counted from its files under `data_dir` (or
    $COTGAP_DATA_DIR) as `cotgap ls items` counts them; a split whose file cannot be read there
    is left out (unknown)."""
    spec = task_spec(task)
    sizes = _sizes(spec)
    if spec.source.hub is None and spec.source.sandbox is None:
        for split in ("train", "test"):
            if split not in sizes:
                with contextlib.suppress(UserError):  # no file here: the size stays unknown
                    sizes[split] = len(load_items(spec, split, data_dir))
    return sizes


def list_tasks_table(data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows for `cotgap ls tasks`: from the YAMLs alone; with a `data_dir`, the items of a
    local-file task whose YAML gives no sizes are counted from its files (`counted_sizes`)."""
    rows = []
    for name in task_names():
        spec = load_task(name)
        sizes = _sizes(spec) if data_dir is None else counted_sizes(spec, data_dir)
        if spec.source.sandbox is not None:
            source = f"sandbox:{spec.source.sandbox.generator}"
        else:
            source = spec.source.hub.id if spec.source.hub else "files only"
        shown = [f"{k} {sizes[k]}" for k in ("train", "test") if k in sizes]
        described = spec.model_dump(include={"version", "answer_type", "extractor", "headline"})
        splits = " / ".join(shown) or "train / test"
        rows.append({"name": name, **described, "source": source, "splits": splits, "sizes": sizes})
    return rows


# --- rows from files, the hub, or the sandbox --------------------------------------------------------------


@dataclass
class _Row:
    where: str  # for messages: "<file> line 12", "hub openai/gsm8k split test row 3"
    split: str  # the source split it came from: train, test or all
    index: int  # source_index
    data: dict


def data_dir_or_env(data_dir: str | Path | None) -> Path | None:
    value = data_dir if data_dir is not None else os.environ.get("COTGAP_DATA_DIR")
    return Path(value) if value else None


def read_utf8(path: Path) -> str:
    """A file's text; one that is not UTF-8 is a UserError naming the line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(
            f"{path}: line {line}: not UTF-8 text (byte {e.start}); save the file as UTF-8."
        ) from None


def _read_records(path: Path, fmt: str) -> list[tuple[str, Any]]:
    """(position label, record) for every record of one original file."""
    if not path.is_file():
        raise FileNotFoundError(path)
    if fmt == "asdiv_xml":
        import xml.etree.ElementTree as ET

        try:
            problems = ET.parse(path).getroot().iter("Problem")
        except ET.ParseError as e:
            raise UserError(f"{path}: malformed XML ({e}); use the original ASDiv.xml.") from None
        return [
            (f"<Problem> {i + 1}", {**p.attrib, **{c.tag: (c.text or "") for c in p}})
            for i, p in enumerate(problems)
        ]
    text = read_utf8(path)
    if fmt == "jsonl":
        out = []
        for lineno, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    out.append((f"line {lineno}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise UserError(
                        f"{path}: line {lineno}: not valid JSON ({e.msg}, column {e.colno}); "
                        "the file must hold one JSON object per line."
                    ) from None
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}).") from None
    if fmt == "json_examples":
        if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
            raise UserError(f"{path}: expected a JSON object with an 'examples' array.")
        return [(f"examples[{i}]", r) for i, r in enumerate(data["examples"])]
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON array of objects.")
    return [(f"element {i + 1} of the array", r) for i, r in enumerate(data)]


def _file_rows(spec: TaskSpec, keys: Iterable[str], data_dir: Path | None) -> list[_Row]:
    files, fields = spec.source.files, spec.fields
    assert files is not None and fields is not None and data_dir is not None  # Source, TaskSpec
    splits = cast("dict[str, tuple[str, ...]]", files.splits)
    rows: list[_Row] = []
    for key in keys:
        index = 0  # several files in one split continue one numbering
        for rel in splits[key]:
            path = data_dir / rel
            if rel in files.optional and not path.is_file():
                continue
            try:
                records = _read_records(path, files.format)
            except FileNotFoundError:
                raise UserError(
                    f"{path}: no such file; task {spec.name} reads {rel} under the data dir {data_dir} "
                    f"(laid out as ../shared/data; see {_file_of(spec.name)} source.files). Copy the "
                    "original file there, or unset --data-dir / COTGAP_DATA_DIR to load from the hub."
                ) from None
            if not records:
                raise UserError(
                    f"{path}: holds no records; task {spec.name} reads the original {rel} there. "
                    "Copy the complete file again."
                )
            for label, record in records:
                if not isinstance(record, dict):
                    raise UserError(
                        f"{path}: {label}: expected a JSON object, got {type(record).__name__}."
                    )
                rows.append(_Row(f"{path} {label}", key, index, record))
                index += 1
    if files.keep_ids:
        keep: set[str] = set()
        for rel in files.keep_ids:
            path = data_dir / rel
            if not path.is_file():
                raise UserError(
                    f"{path}: no such file; task {spec.name} keeps the ids listed there."
                )
            keep.update(read_utf8(path).split())
        id_path = fields.id
        if id_path is None:
            raise UserError(
                f"task {spec.name}: source.files.keep_ids lists ids, but fields.id does not say "
                "where a row's id is; add fields.id to the task's YAML."
            )
        rows = [r for r in rows if str(_get(r.data, id_path)) in keep]
    return rows


def _hub_rows(spec: TaskSpec, keys: Iterable[str]) -> list[_Row]:
    hub = spec.source.hub
    if hub is None:
        raise UserError(
            f"task {spec.name} has no hub source ({spec.source.no_hub}); give the folder with its "
            f"files ({_file_list(spec)}) as data_dir: in a config, --data-dir or COTGAP_DATA_DIR."
        )
    try:
        import datasets
    except ImportError:
        raise UserError("loading from the hub needs the `datasets` package; install it.") from None
    rows: list[_Row] = []
    splits = cast("dict[str, tuple[str, ...]]", hub.splits)
    for key in keys:
        index = 0
        for hub_split in splits[key]:
            try:
                ds = datasets.load_dataset(
                    hub.id, hub.config, revision=hub.revision, split=hub_split
                )
            except Exception as e:
                why = "check that the machine is online and the dataset reachable"
                for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
                    if os.environ.get(flag, "").lower() in ("1", "true", "yes", "on"):
                        why = "this machine is offline (HF_HUB_OFFLINE is set)"
                raise UserError(
                    f"task {spec.name}: could not load {hub.id} (config {hub.config}, revision "
                    f"{hub.revision}, split {hub_split}) from the hub: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}; {why}. Pass --data-dir DIR (or set "
                    f"COTGAP_DATA_DIR) with the original files: {_file_list(spec)}."
                ) from None
            for row in ds:
                where = f"hub {hub.id} ({hub.config}) split {hub_split} row {index + 1}"
                rows.append(_Row(where, key, index, dict(row)))
                index += 1
    return rows


def files_problem(task: TaskSpec | str, data_dir: str | Path | None) -> str | None:
    """Why a task's items cannot be read here, said before anything runs, or None: a task of
    local files alone with no data dir, or a data dir (argument or $COTGAP_DATA_DIR) without a
    file the task names (with a data dir every task but a sandbox one reads its files)."""
    spec = task_spec(task)
    src, root = spec.source, data_dir_or_env(data_dir)
    if src.sandbox is not None:
        return None
    if root is None:
        if src.hub is not None:
            return None
        return (
            f"task {spec.name} reads local files only ({_file_list(spec)}) and no data dir is "
            "given; set data_dir: in the config to the folder they are under (or --data-dir, "
            "or $COTGAP_DATA_DIR)"
        )
    if src.files is None:
        return None
    missing = [
        str(root / rel)
        for paths in src.files.splits.values()
        for rel in paths
        if rel not in src.files.optional and not (root / rel).is_file()
    ]
    if not missing:
        return None
    return (
        f"task {spec.name}: no file {', '.join(missing)}; its YAML ({_file_of(spec.name)}) names "
        f"them under the data dir {root}: fix data_dir (or --data-dir, $COTGAP_DATA_DIR) or copy "
        "the files there"
    )


def _file_list(spec: TaskSpec) -> str:
    files = spec.source.files
    return ", ".join(p for paths in files.splits.values() for p in paths) if files else ""


def _sandbox_rows(spec: TaskSpec, keys: Iterable[str], data_dir: Path | None) -> list[_Row]:
    sb = spec.source.sandbox
    assert sb is not None
    return [_Row(*row) for row in sandbox.source_rows(sb.generator, _sizes(spec), sb.seed, keys)]


# How each kind of source gives its rows: (spec, source splits, data dir) -> rows. Rows become
# items through the task's fields (a sandbox generator's items have fixed ones).
_SOURCES: dict[str, Callable[[TaskSpec, Iterable[str], Path | None], list[_Row]]] = {
    "hub": lambda spec, keys, data_dir: _hub_rows(spec, keys),
    "files": _file_rows,
    "sandbox": _sandbox_rows,
}
_SANDBOX_FIELDS = Fields(id="id", question="question", answer="answer", rationale="rationale")


# --- rows to items ------------------------------------------------------------------------------------------

_MISSING = object()


def _get(row: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(row, dict) and part in row:
            row = row[part]
        elif isinstance(row, list) and part.isdigit() and int(part) < len(row):
            row = row[int(part)]
        else:
            return _MISSING
    return row


def _field(spec: TaskSpec, row: _Row, path: str, what: str) -> Any:
    value = _get(row.data, path)
    if value is _MISSING or value is None:
        raise UserError(
            f"{row.where}: field {path!r} ({what}) is missing; task {spec.name} expects it there "
            f"({_file_of(spec.name)} fields). Is this the right file for the task?"
        )
    return value


def _parse_choices(value: Any) -> list[tuple[str, str]] | None:
    """(label, text) from [{label,text}], {label:[...], text:[...]} or ["A)$61", ...]."""
    if (
        isinstance(value, dict)
        and isinstance(value.get("label"), list)
        and isinstance(value.get("text"), list)
    ):
        return [(str(lab), str(t)) for lab, t in zip(value["label"], value["text"], strict=False)]
    if isinstance(value, list) and all(
        isinstance(c, dict) and "label" in c and "text" in c for c in value
    ):
        return [(str(c["label"]), str(c["text"])) for c in value]
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        found = [m for c in value if (m := re.match(r"\s*\(?([A-Za-z0-9])\)\s*(.*)", c, re.S))]
        return [(m.group(1), m.group(2)) for m in found] if len(found) == len(value) else None
    return None


def _options_in_question(question: str) -> list[str]:
    """Option texts listed as "(A) text" lines in a question (BBH), in order."""
    return [m.group(2).strip() for m in re.finditer(r"(?m)^\(([A-R])\)\s*(.+)$", question)]


def _gold_and_choices(
    spec: TaskSpec, fields: Fields, row: _Row
) -> tuple[Any, list[tuple[str, str]] | None]:
    raw = _field(spec, row, fields.answer, "gold answer")
    choices = None
    if fields.choices:
        choices = _parse_choices(_field(spec, row, fields.choices, "answer choices"))
        if not choices:
            raise UserError(f"{row.where}: field {fields.choices!r}: not a list of answer choices.")
    how, field = fields.answer_from, f"{row.where}: field {fields.answer!r}"
    if how == "after_hashes":
        if not isinstance(raw, str) or "####" not in raw:
            raise UserError(f"{field}: no '#### <answer>' line.")
        raw = raw.rpartition("####")[2]
    elif how == "boxed":
        boxed = answers.last_boxed(raw) if isinstance(raw, str) else None
        if boxed is None:
            raise UserError(f"{field}: no \\boxed{{...}} answer.")
        raw = boxed
    elif how in ("target_scores", "choice_scores"):
        if how == "target_scores":
            if not isinstance(raw, dict):
                raise UserError(f"{field}: expected an object of scores.")
            texts, scores = list(raw), list(raw.values())
        else:
            texts, scores = [t for _, t in choices or []], raw
        best = [i for i, s in enumerate(scores) if s == 1]
        if len(best) != 1 or len(scores) != len(texts):
            raise UserError(f"{field}: needs exactly one option scored 1.")
        # BIG-bench options continue the input ("...Alice has the " + "blue ball."): drop the period.
        choices = [(answers.LETTERS[i], t.strip().removesuffix(".")) for i, t in enumerate(texts)]
        raw = answers.LETTERS[best[0]] if spec.answer_type == "choice" else texts[best[0]]
    elif how == "yes_no_bool":
        if not isinstance(raw, bool):
            raise UserError(f"{field}: expected true or false.")
        raw = "yes" if raw else "no"
    elif how == "leading_number":
        raw = str(raw).split("(", 1)[0].strip()
    return raw, choices


def _make_item(spec: TaskSpec, fields: Fields, row: _Row, default_id: str) -> Item:
    paths = (fields.question,) if isinstance(fields.question, str) else fields.question
    parts = []
    for path in paths:
        part = _field(spec, row, path, "question")
        if not isinstance(part, str) or not part.strip():
            raise UserError(f"{row.where}: field {path!r} (question) must be non-empty text.")
        parts.append(part.strip())
    question = " ".join(parts)
    raw, choices = _gold_and_choices(spec, fields, row)
    meta: dict[str, Any] = {}
    if spec.answer_type == "choice" and choices:
        labels = [label for label, _ in choices]
        if not (isinstance(raw, str) and raw.strip("() ") in labels):
            raise UserError(
                f"{row.where}: field {fields.answer!r}: gold {raw!r} is not one of the labels {labels}."
            )
        position = labels.index(raw.strip("() "))
        order = list(range(len(choices)))
        if spec.shuffle_choices:
            seed = f"{spec.split.seed if spec.split else 0}\n{question}".encode()
            random.Random(hashlib.sha256(seed).hexdigest()).shuffle(order)
        texts = [choices[i][1].strip() for i in order]
        raw = answers.LETTERS[order.index(position)]
        listed = ", ".join(f"({answers.LETTERS[i]}) {t}" for i, t in enumerate(texts))
        meta["stem"] = question
        question = _render(spec.prompt.choices, question=question, choices=listed)
        meta["choices"] = texts
    elif spec.answer_type == "choice":
        options = _options_in_question(question)
        meta["choices"] = options or None
        if answers.canonical("choice", raw) is None and isinstance(raw, str):
            # BBH's targets are "(B)", but a few give the option's text: map it to its letter.
            said = " ".join(raw.split())
            same = [i for i, t in enumerate(options) if " ".join(t.split()) == said]
            if len(same) == 1:
                raw = answers.LETTERS[same[0]]
    gold = answers.canonical(spec.answer_type, raw)
    if gold is None:
        raise UserError(
            f"{row.where}: field {fields.answer!r}: gold answer {str(raw)[:80]!r} is not a valid "
            f"{spec.answer_type} answer; check the file, or the task's answer_type."
        )
    if fields.rationale:
        rationale = _get(row.data, fields.rationale)
        if isinstance(rationale, list):
            rationale = " ".join(str(r) for r in rationale)
        if isinstance(rationale, str):
            meta["rationale"] = rationale
    for path in fields.meta:
        value = _get(row.data, path)
        if value is not _MISSING:
            meta[path.rsplit(".", 1)[-1]] = value
    item_id = str(_field(spec, row, fields.id, "id")) if fields.id else default_id
    return Item(item_id, row.index, question, gold, meta)


def _split_order(items: list[Item], split: SplitSpec) -> tuple[list[Item], list[Item]]:
    """Train and test of a single pool: items ordered by a seeded hash of their question."""

    def key(item: Item) -> tuple[str, int]:
        text = f"{split.seed}\n{' '.join(item.question.split())}"
        return hashlib.sha256(text.encode()).hexdigest(), item.source_index

    ordered = sorted(items, key=key)
    a, b = split.ratio
    n_train = (2 * len(items) * a + (a + b)) // (2 * (a + b))  # round half up
    return ordered[:n_train], ordered[n_train:]


def load_items(
    task: TaskSpec | str,
    split: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
) -> list[Item]:
    """Items of one split, every row validated; the first `limit` of them when given.

    Files under `data_dir` (or $COTGAP_DATA_DIR) when set, else the hub; a sandbox task's from its
    generator. The train/test split of a single pool is its seeded hash order; a source's own
    train/test files keep their file order.
    """
    spec = task_spec(task)
    if split not in SPLITS:
        raise UserError(
            f"unknown split {split!r} for task {spec.name}; valid: {', '.join(SPLITS)}."
        )
    src, root = spec.source, data_dir_or_env(data_dir)
    kind = "sandbox" if src.sandbox else "files" if root is not None else "hub"
    pooled = src.files is not None and set(src.files.splits) == {"all"}
    keys = ["all"] if pooled else (["train", "test"] if split == "all" else [split])
    if spec.train_excludes_test and "train" in keys:
        keys = ["train", "test"]  # the test questions are needed to leave them out
    rows = _SOURCES[kind](spec, keys, root)
    fields = _SANDBOX_FIELDS if src.sandbox else spec.fields
    if kind == "hub" and src.hub is not None and src.hub.fields is not None:
        fields = src.hub.fields
    assert fields is not None  # TaskSpec: hub and file sources have fields
    skip = {e.index for e in spec.exclude}
    rows = [row for row in rows if row.index not in skip]
    items = []
    for row in rows:
        split_part = "" if pooled else f"{row.split}-"
        items.append(_make_item(spec, fields, row, f"{spec.name}-{split_part}{row.index}"))
    _check_unique(spec, items, [r.where for r in rows])  # the whole pool, before it is divided
    if spec.train_excludes_test:
        items = _without_test_questions(items, [r.split for r in rows], split)
    expected = _sizes(spec)
    if pooled and split != "all":
        assert spec.split is not None  # TaskSpec: a pooled source has a split
        _check_size(spec, "all", len(items), expected.get("all"), root)
        train, test = _split_order(items, spec.split)
        items = train if split == "train" else test
    if kind != "files" or not _missing_optional(spec, split, root):
        _check_size(spec, split, len(items), expected.get(split), root)
    return items[:limit] if limit is not None else items


def _without_test_questions(items: list[Item], splits: list[str], wanted: str) -> list[Item]:
    """The items of split `wanted` (or all), train leaving out every question that test holds."""
    test = {
        " ".join(it.question.split()) for it, s in zip(items, splits, strict=True) if s == "test"
    }
    kept = []
    for item, s in zip(items, splits, strict=True):
        if s == "train" and " ".join(item.question.split()) in test:
            continue
        if wanted in ("all", s):
            kept.append(item)
    return kept


def _missing_optional(spec: TaskSpec, split: str, root: Path | None) -> bool:
    """Whether an optional file of `split` is absent from the data dir (its size is then open)."""
    files = spec.source.files
    assert files is not None
    splits = cast("dict[str, tuple[str, ...]]", files.splits)
    keys = ("train", "test") if split == "all" else (split,)
    paths = [p for k in keys for p in splits.get(k, ()) if p in files.optional]
    return root is not None and any(not (root / p).is_file() for p in paths)


def excluded(task: TaskSpec | str) -> list[dict[str, Any]]:
    """The rows a task leaves out of every split (tasks/<name>.yaml `exclude`), with the reason."""
    return [{"source_index": e.index, "reason": e.reason} for e in task_spec(task).exclude]


def excluded_ids(spec: TaskSpec) -> set[str]:
    """Item ids the excluded rows would have had (pooled sources without an id field)."""
    files, fields = spec.source.files, spec.fields
    if files is None or set(files.splits) != {"all"} or fields is None or fields.id is not None:
        return set()
    return {f"{spec.name}-{e.index}" for e in spec.exclude}


def _check_size(
    spec: TaskSpec, split: str, n: int, expected: int | None, root: Path | None
) -> None:
    if expected is None or n == expected:
        return
    where = f"the data dir {root}" if root is not None else "the hub"
    raise UserError(
        f"task {spec.name}: {split} has {n} items from {where}, but {_file_of(spec.name)} "
        f"(version {spec.version}) expects {expected}: this copy of the data differs from the one "
        "the task was written for. Use the original files, or make a new task version."
    )


def _check_unique(spec: TaskSpec, items: list[Item], wheres: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if item.id in seen:
            j = seen[item.id]
            raise UserError(
                f"task {spec.name}: id {item.id!r} appears twice (source_index {items[j].source_index} "
                f"and {item.source_index}; rows: {wheres[j]} and {wheres[i]}); ids must be unique within a task."
            )
        seen[item.id] = i


# --- prompts ------------------------------------------------------------------------------------------------


def _render(template: str, **values: str) -> str:
    """Fill {name} placeholders in one pass: braces inside the values are left alone."""
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group()), template)


@functools.lru_cache(maxsize=128)
def _read_fewshot(path: str, kind: str, mtime_ns: int) -> tuple[str, tuple[tuple[str, str], ...]]:
    if kind == "file":
        shots: FewShotFile = parse(FewShotFile, read_yaml(path), path)
        return shots.preamble, tuple((e.question, e.answer) for e in shots.exemplars)
    # A BBH cot-prompts file: canary line, "-----", a one-line task description, then Q:/A: blocks.
    text = Path(path).read_text(encoding="utf-8").replace("\r\n", "\n")
    body = text.split("\n-----\n", 1)[-1].strip()
    blocks = re.split(r"\n\n(?=Q: )", body)
    preamble = "" if blocks[0].startswith("Q: ") else blocks.pop(0).strip()
    exemplars = []
    for i, block in enumerate(blocks):
        q, sep, a = block.partition("\nA: ")
        if not sep or not q.startswith("Q: "):
            raise UserError(f"{path}: exemplar {i + 1} is not a 'Q: ...' / 'A: ...' block.")
        exemplars.append((q.removeprefix("Q: ").strip(), a.strip()))
    if not exemplars:
        raise UserError(f"{path}: no 'Q: ... A: ...' exemplars found.")
    return preamble, tuple(exemplars)


def fewshot_exemplars(
    task: TaskSpec | str, data_dir: str | Path | None = None
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(preamble, ((question, answer), ...)) of a task's few-shot CoT exemplars."""
    spec = task_spec(task)
    ref = spec.fewshot
    if ref is None:
        raise UserError(
            f"task {spec.name} has no few-shot exemplars; use prompt_style: zero_shot_cot."
        )
    if ref.file is not None:
        path, kind = _file_of(spec.name).parent / ref.file, "file"
    else:
        assert ref.data_file is not None  # FewShot: exactly one of file and data_file
        path, kind = _prompts_file(ref.data_file, data_dir_or_env(data_dir)), "data_file"
    if not path.is_file():
        raise UserError(
            f"{path}: no such file; task {spec.name} reads its few-shot exemplars there. Copy the "
            f"original {ref.file or ref.data_file} there, or reinstall cotgap (it ships them)."
        )
    return _read_fewshot(str(path), kind, path.stat().st_mtime_ns)


def _file_of(name: str) -> Path:
    """The task's YAML (where messages point, and what few-shot files are relative to)."""
    return task_file(name) or tasks_dir() / f"{name}.yaml"


def _prompts_file(rel: str, root: Path | None) -> Path:
    """A prompts file named relative to the data dir: the data dir's copy where it holds one, else
    the copy the package ships under the tasks dir (tasks/bbh/cot-prompts: the same
    bytes as the BBH repository's)."""
    if root is not None and (root / rel).is_file():
        return root / rel
    return tasks_dir() / rel


def fewshot_problems(names: Iterable[str], data_dir: str | Path | None) -> list[str]:
    """Why each of these tasks, which have few-shot exemplars, cannot prompt with them here (a
    prompts file that cannot be found or read); `cotgap validate` reports them before any model
    starts."""
    problems = []
    for name in names:
        try:
            if load_task(name).fewshot is None:
                continue  # no exemplars at all: validate names the stage that asks (feasible.py)
            fewshot_exemplars(name, data_dir)
        except UserError as e:
            problems.append(f"few-shot prompts of task {name}: {e}")
    return problems


def _same_question(item: Item, exemplar_question: str) -> bool:
    stem = " ".join(item.meta.get("stem", item.question).split()).lower()
    return " ".join(exemplar_question.split()).lower().startswith(stem)


def render_prompt(
    task: TaskSpec | str,
    item: Item,
    style: PromptStyle,
    num_fewshot: int = 0,
    data_dir: str | Path | None = None,
) -> str:
    """The user message for an item. Few-shot uses the first `num_fewshot` exemplars (0 = all),
    leaving out an exemplar that is this very question."""
    spec = task_spec(task)
    if style == "zero_shot_cot":
        return _render(spec.prompt.zero_shot_cot, question=item.question)
    if style != "few_shot_cot":
        raise UserError(f"unknown prompt style {style!r}; valid: zero_shot_cot, few_shot_cot.")
    preamble, exemplars = fewshot_exemplars(spec, data_dir)
    usable = [(q, a) for q, a in exemplars if not _same_question(item, q)]
    if num_fewshot > len(usable):
        raise UserError(
            f"task {spec.name}: num_fewshot {num_fewshot} but only {len(usable)} exemplars are available."
        )
    chosen = usable[:num_fewshot] if num_fewshot else usable
    block = "".join(_render(spec.prompt.exemplar, question=q, answer=a) for q, a in chosen)
    if preamble:
        block = f"{preamble}\n\n{block}"
    return _render(spec.prompt.few_shot_cot, fewshot=block, question=item.question)


def items_jsonl(
    task: TaskSpec | str,
    split: str,
    data_dir: str | Path | None = None,
    out: str | Path | TextIO | None = None,
    limit: int | None = None,
) -> int:
    """Write a split's items as JSONL {id, source_index, question, gold}: to a file path
    (atomically), a stream, or stdout. Returns the number of items."""
    items = load_items(task, split, data_dir, limit)
    keys = ("id", "source_index", "question", "gold")
    text = jsonl_text({k: getattr(it, k) for k in keys} for it in items)
    if isinstance(out, (str, Path)):
        atomic_write_text(Path(out), text, OUT_FIX)
    else:
        (out or sys.stdout).write(text)
    return len(items)


# --- a new task's file ---------------------------------------------------------------------------

_NEW_TYPES = {  # --answer-type: (answer_type, extractor, the prompt's last line, choices field)
    "number": ("number", "number", 'End with "The answer is N."', None),
    "choice": (
        "choice",
        "choice",
        'End with "The answer is (X)." where X is the letter.',
        "choices",
    ),
    "text": ("string", "string", 'End with "The answer is ..." and the answer.', None),
}


_NEW_OPTIONAL = ("id", "rationale")  # fields of `Fields` a new task takes when the data has them


def _new_splits(name: str, data: Path) -> tuple[dict[str, list[str]], list[Path]]:
    """A new task's `source.files.splits` (paths under `data`'s parent, the data dir) and files:
    train.jsonl and test.jsonl, or one JSONL pool divided by the question hash."""
    pair = [data / "train.jsonl", data / "test.jsonl"]
    if all(p.is_file() for p in pair):
        return {s: [f"{data.name}/{s}.jsonl"] for s in ("train", "test")}, pair
    pool = sorted(data.glob("*.jsonl"))
    if len(pool) == 1:
        return {"all": [f"{data.name}/{pool[0].name}"]}, pool
    raise UserError(
        f"--data {data}: expected train.jsonl and test.jsonl, or one .jsonl file (divided 3:2 into "
        f"train and test), found {len(pool)} .jsonl file(s); put task {name}'s items there."
    )


def new_task_text(name: str, data: Path, answer_type: str = "number") -> tuple[str, list[str]]:
    """The YAML of a new JSONL task reading the files of folder `data` (its parent is the data
    dir) and notes for the user (fields the first row lacks); checked against the schema."""
    if answer_type not in _NEW_TYPES:
        raise UserError(f"--answer-type {answer_type}: valid: {', '.join(_NEW_TYPES)}.")
    kind, extractor, ending, choices = _NEW_TYPES[answer_type]
    splits, files = _new_splits(name, data)
    first = _first_record(files[0])
    fields = {"question": "question", "answer": "answer"} | (
        {"choices": choices} if choices else {}
    )
    # the optional fields the data has under their own names: its ids (predictions and
    # `cotgap score` key items by them) and its worked solutions
    fields |= {key: key for key in _NEW_OPTIONAL if key in first}
    spec = {
        "name": name, "version": 1, "description": f"{name} (edit: what the task is)",
        "splits_note": "train for teacher traces, test for scoring" if "train" in splits
        else "one pool, divided 3:2 into train and test by a seeded hash of the question",
        "answer_type": kind, "extractor": extractor, "headline": "strict",
        "source": {"no_hub": "my own data", "files": {"format": "jsonl", "splits": splits}},
        "fields": fields, **({} if "train" in splits else {"split": {"ratio": [3, 2], "seed": 1234}}),
        "prompt": {"zero_shot_cot": "{question}\nLet's think step by step. " + ending},
    }  # fmt: skip
    parse(TaskSpec, spec, f"task {name}")
    text = _yaml_text(spec)
    notes = [
        f"{files[0]}: the first row has no field {f!r} (its fields: {', '.join(first)}); edit "
        f"fields.{key} in the task file"
        for key, f in fields.items()
        if f not in first
    ]
    return text, notes


def _first_record(path: Path) -> dict[str, Any]:
    for n, line in enumerate(read_utf8(path).splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(
                    f"{path}: line {n}: not JSON ({e.msg}); one object per line."
                ) from None
            return record if isinstance(record, dict) else {}
    raise UserError(f"{path}: holds no records; put one JSON object per line there.")


def _yaml_text(data: dict[str, Any]) -> str:
    """YAML of `data` with multi-line strings (prompts) as `|-` blocks, keys in their order."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100)
