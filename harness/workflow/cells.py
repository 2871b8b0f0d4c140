"""Cells: the unit of work and of storage. One frozen spec per kind.

A kind names an artefact, a stage the verb that computes it, a phase its position in a run:

    phase  stage     kind      what
    0      evaluate  eval      task pre-selection: a teacher on a candidate task (with `select:`)
    1      generate  traces    a teacher's CoT samples on a task's train split
    2      evaluate  eval      a teacher or a student baseline on the test split (no adapter)
    3      train     dataset   the examples a regime selects from teacher traces
    4      screen    screen    the student's signals on a dataset, no training (with `screen:`)
    5      train     adapter   a student fine-tuned on a dataset, one per seed
    6      evaluate  eval      a distilled student (an adapter) on the test split

A spec carries its identity (`config`, what its key hashes, with the engine or package versions),
its inputs (`upstream` keys), and the typed names a reader needs (model, task, role, teacher,
regime, trace_seed, seed). Building a spec computes its key and nothing else: no store, no stage,
no engine.
Trace draws (`generate.seeds`): a traces cell's identity holds the generate config with `seed` set
to its draw's seed and without `seeds`, so a draw at seed s has the key of a grid with
`generate.seed: s`; the cells downstream of a draw differ only through their upstream keys.
`trace_seed` names the draw of a cell (None where the experiment has no `generate.seeds`: its one
draw at `generate.seed`).
Identity rule: a field added to an identity after keys were published is left out at its old
value, so a cell computed before the addition keeps its key (train.merge, the sandbox generator
version).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

from harness.config.hashing import canonical
from harness.config.schema import EvalConfig, Experiment, ScreenConfig, TrainConfig
from harness.models import sources as models
from harness.store import CELL_KINDS, cell_key, package_versions, vllm_version
from harness.tasks import answers
from harness.workflow import regimes

KINDS = CELL_KINDS  # defined with the store, which names a cell directory by its kind
STAGES = ("generate", "train", "evaluate", "screen")
STAGE_OF_KIND = {
    "traces": "generate",
    "dataset": "train",
    "screen": "screen",
    "adapter": "train",
    "eval": "evaluate",
}
PHASES = {  # phase -> (stage, title)
    0: ("evaluate", "task pre-selection"),  # only with `select:`
    1: ("generate", "teacher traces"),
    2: ("evaluate", "teacher and baseline evals"),
    3: ("train", "training sets"),
    4: ("screen", "student-side screens of the training sets"),
    5: ("train", "LoRA adapters"),
    6: ("evaluate", "distilled evals"),
}
SCREEN_VERSION = 1  # bump when a signal's definition (harness/stages/screen.py) changes
SCREEN_SIGNALS = (
    "nll",
    "mean_rank",
    "median_rank",
    "rsr",
    "top1",
    "top5",
)  # harness/stages/screen.py
SCREEN_DIRECTION = {  # +1: a higher value predicts more gain; fixed before any result was seen
    "nll": -1,
    "mean_rank": -1,
    "median_rank": -1,
    "rsr": -1,  # arXiv 2601.14249: low rank for surprising tokens
    "top1": 1,
    "top5": 1,
    "local_nll": -1,  # arXiv 2510.03988: high local naturalness (log-probability) is better
}
TRAIN_PACKAGES = ("torch", "transformers", "peft", "accelerate")
Role = Literal["teacher", "baseline", "distilled", "adhoc", "select"]


@dataclasses.dataclass(frozen=True, eq=False)  # a cell is itself: compared and hashed by identity
class Cell:
    """What every kind has: `config` is what the key hashes; `model` is the model the cell runs
    (the teacher of traces, the evaluated model, the student a dataset or adapter is for)."""

    kind: ClassVar[str]
    phase: ClassVar[int]
    key: str
    config: dict[str, Any]
    upstream: tuple[str, ...]
    model: str
    task: str

    @property
    def limit(self) -> int | None:
        """How many of the task split's items the cell reads (None: all)."""
        return self.config["task"]["limit"]

    @property
    def extractor(self) -> str:
        return self.config["task"]["extractor"]

    @property
    def stage(self) -> str:
        return STAGE_OF_KIND[self.kind]

    @property
    def label(self) -> str:
        """`eval:distilled/stu/t-large/coin_flip/matched/trace1/0`: the names that are set, the
        trace draw as trace<seed>, the training seed last."""
        parts = [getattr(self, k, None) for k in ("role", "model", "teacher", "task", "regime")]
        trace = getattr(self, "trace_seed", None)
        parts += [None if trace is None else f"trace{trace}", getattr(self, "seed", None)]
        return f"{self.kind}:" + "/".join(str(p) for p in parts if p is not None)

    def resources(self, exp: Experiment, gpus_available: bool = True) -> dict[str, float]:
        """What the cell's group asks of a scheduler: the model's `resources`, or from its size."""
        spec = exp.model(self.model)
        r, e = spec.resources, spec.engine
        # a served model's requests need no device here; only traces cells run one engine
        # replica per engine.data_parallel_size (harness/stages/generate.py), the others one
        if spec.served:
            parallel = 0
        else:
            replicas = e.data_parallel_size if self.kind == "traces" else 1
            parallel = e.tensor_parallel_size * e.pipeline_parallel_size * replicas
        gpus = r.gpus if r.gpus is not None else float(self._parallel(exp, parallel))
        memory = r.memory_gb
        if memory is None and spec.size:
            memory = round(spec.size * 2 * 1.3 / 2**30 + 2, 1)  # bf16 weights + 30% + runtime
        return {"gpus": gpus if gpus_available else 0.0, "cpus": r.cpus, "memory_gb": memory or 0.0}

    def _parallel(self, exp: Experiment, engine_parallel: int) -> int:
        return engine_parallel


@dataclasses.dataclass(frozen=True, eq=False)
class Traces(Cell):
    kind: ClassVar[str] = "traces"
    phase: ClassVar[int] = 1
    role: Role = "teacher"
    trace_seed: int | None = None

    @classmethod
    def of(
        cls, exp: Experiment, ident: dict, teacher: str, task: str, trace_seed: int | None = None
    ) -> Traces:
        """`trace_seed`: the draw (one of generate.seeds); None: the one draw at generate.seed."""
        seed = exp.generate.seed if trace_seed is None else trace_seed
        config = {"model": ident, "task": _task(exp, task, "train")}
        config["generate"] = _shared(exp, ("generate", seed), lambda: _generate_identity(exp, seed))
        key = cell_key("traces", config, (), engine_versions(exp.generate.engine, ident))
        return cls(key, config, (), teacher, task, trace_seed=trace_seed)


def _generate_identity(exp: Experiment, seed: int) -> dict[str, Any]:
    """One draw's generate settings: `seed` that draw's, `seeds` (the grid's choice) left out."""
    settings = canonical(exp.generate)
    settings.pop("seeds")  # added after keys were published: never in a traces key
    if "kd" in exp.train.methods:  # the teacher's top-k distributions are captured with the traces
        settings["top_logprobs"] = exp.train.kd.top_k
    return {**settings, "seed": seed}


@dataclasses.dataclass(frozen=True, eq=False)
class Eval(Cell):
    """A teacher, a baseline, a distilled student (its adapter is `upstream[0]`), or an ad-hoc
    adapter directory (`adapter_dir`, outside the grid)."""

    kind: ClassVar[str] = "eval"
    role: Role = "baseline"
    teacher: str | None = None
    regime: str | None = None
    seed: int | None = None
    adapter_dir: str | None = None
    trace_seed: int | None = None  # a distilled eval: its adapter's trace draw

    @property
    def phase(self) -> int:  # type: ignore[override]
        if self.role == "select":
            return 0
        return 6 if self.upstream else 2

    def eval_config(self, exp: Experiment) -> EvalConfig:
        """The eval config the cell is scored under: the experiment's, or the selection's."""
        if self.role != "select":
            return exp.evaluate
        return EvalConfig.model_validate(self.config["evaluate"])

    @classmethod
    def selection(cls, exp: Experiment, ident: dict, teacher: str, task: str) -> Eval:
        """A teacher on a candidate task for pre-selection (`exp.select`): its split, prompt
        style and limit; the rest of the eval config is the experiment's."""
        sel = exp.select
        assert sel is not None
        ev = exp.evaluate.model_copy(
            update={"prompt_style": sel.prompt_style, "num_fewshot": sel.num_fewshot}
        )
        task_id = dict(task_identity(exp, task, sel.split))
        task_id["limit"] = sel.limit or task_id["limit"]
        config = {"model": ident, "adapter": None, "task": task_id, "evaluate": canonical(ev)}
        key = cell_key("eval", config, (), engine_versions(exp.evaluate.engine, ident))
        return cls(key, config, (), teacher, task, role="select")

    @property
    def student(self) -> str | None:
        return self.model if self.role in ("baseline", "distilled") else None

    @classmethod
    def of(
        cls,
        exp: Experiment,
        ident: dict,
        model: str,
        task: str,
        adapter: Any = None,
        **names: Any,
    ) -> Eval:
        """`adapter`: the Adapter cell scored, or an ad-hoc adapter's identity (a dict)."""
        from_grid = isinstance(adapter, Adapter)
        config = {
            "model": ident,
            "adapter": adapter.key if from_grid else adapter,
            "task": _task(exp, task, "test"),
            "evaluate": _shared(exp, ("evaluate",), lambda: canonical(exp.evaluate)),
        }
        up = (adapter.key,) if from_grid else ()
        key = cell_key("eval", config, up, engine_versions(exp.evaluate.engine, ident))
        return cls(key, config, up, model, task, **names)


@dataclasses.dataclass(frozen=True, eq=False)
class _Distilling(Cell):
    """A cell of a student's distillation from one teacher's traces (of the trace draw
    `trace_seed`); `model` is the student."""

    teacher: str = ""
    regime: str = "per_teacher"
    trace_seed: int | None = None

    @property
    def student(self) -> str:
        return self.model


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset(_Distilling):
    """The training examples of one (student, teacher, task, regime, trace draw)."""

    kind: ClassVar[str] = "dataset"
    phase: ClassVar[int] = 3

    def resources(self, exp: Experiment, gpus_available: bool = True) -> dict[str, float]:
        if "filter" in self.config:  # per-item filtering runs the student: one device
            r = super().resources(exp, gpus_available)
            return {**r, "gpus": min(r["gpus"], 1.0)}
        return {"gpus": 0.0, "cpus": 1.0, "memory_gb": 0.0}  # selection and tokenization only

    @classmethod
    def of(
        cls,
        exp: Experiment,
        ident: dict,
        student: str,
        teacher: str,
        task: str,
        regime: str,
        traces: dict[str, Traces],
    ) -> Dataset:
        """`teacher`: regimes.MIX_TEACHER for the mix regime (its teachers are train.mix);
        `traces`: every teacher's traces cell of one trace draw, the draw of the set."""
        keys = {name: c.key for name, c in traces.items()}
        mixed = [keys[p.teacher] for p in exp.train.mix] if regime == "mix" else []
        own = None if regime == "mix" else keys[teacher]
        up = regimes.inputs(regime, own or "", list(keys.values()), mixed)
        task_id = _task(exp, task, "train")
        config = {
            "student": ident,
            "task": task_id,
            "regime": regime,
            "teacher": own,
            "teachers": sorted(up),
            "max_length": exp.train.max_length,
            **regimes.key_fields(regime, exp.train, keys),
            # the dataset selects by the current extractor's verdicts: a version bump rebuilds it
            "extractor_version": answers.EXTRACTORS[task_id["extractor"]].version,
        }
        (trace_seed,) = {c.trace_seed for c in traces.values()}
        key = cell_key("dataset", config, up, {})
        return cls(key, config, up, student, task, teacher, regime, trace_seed)


@dataclasses.dataclass(frozen=True, eq=False)
class Screen(_Distilling):
    """The student's signals (NLL, token ranks) on a dataset's examples (`upstream[0]`): one
    forward pass, no training. In the grid only when the experiment has a `screen:` section."""

    kind: ClassVar[str] = "screen"
    phase: ClassVar[int] = 4

    def resources(self, exp: Experiment, gpus_available: bool = True) -> dict[str, float]:
        r = super().resources(exp, gpus_available)
        return {**r, "gpus": min(r["gpus"], 1.0)}  # one forward pass: a single device

    @classmethod
    def of(cls, exp: Experiment, ident: dict, dataset: Dataset) -> Screen:
        # float32 on every device, so that a screen's numbers do not depend on the machine
        config = {"student": ident, "version": SCREEN_VERSION, "dtype": "float32"}
        screen = exp.screen or ScreenConfig()
        if screen.max_examples is not None:
            config["max_examples"] = screen.max_examples
        if screen.local_window:
            config["local_window"] = screen.local_window
        up = (dataset.key,)
        key = cell_key("screen", config, up, package_versions(("torch", "transformers")))
        d = dataset
        return cls(key, config, up, d.model, d.task, d.teacher, d.regime, d.trace_seed)


@dataclasses.dataclass(frozen=True, eq=False)
class Adapter(_Distilling):
    """A student trained on a dataset (`upstream[0]`, of one trace draw) with one training seed."""

    kind: ClassVar[str] = "adapter"
    phase: ClassVar[int] = 5
    seed: int = 0
    method: str = "sft"  # the distillation method (train.methods)

    @functools.cached_property
    def train(self) -> TrainConfig:
        """The training config the key was made from (what the stage trains with)."""
        return TrainConfig.model_validate(self.config["train"])

    @property
    def merge(self) -> bool:
        return self.train.merge

    def _parallel(self, exp: Experiment, engine_parallel: int) -> int:
        return exp.train.num_processes

    @property
    def align(self) -> str:
        """The training budget's alignment (`none`: the cell trains its own config)."""
        return (self.config.get("budget") or {}).get("align", "none")

    @classmethod
    def of(
        cls,
        exp: Experiment,
        ident: dict,
        dataset: Dataset,
        seed: int,
        align: str = "none",
        reference: Dataset | None = None,
        method: str = "sft",
    ) -> Adapter:
        """`align` other than none: trains as many updates as match `reference` (a per_teacher
        dataset, `upstream[1]`) in updates, tokens or examples; the train stage computes them
        from both datasets before training. The reference's own adapter is left unaligned.
        `method`: the distillation method; its settings are in the key (sft: nothing added)."""
        own_batch = dataset.regime == "mix" and align != "batch"
        settings = _shared(exp, ("train", own_batch), lambda: _train_identity(exp, own_batch))
        config = {"student": ident, "train": settings, "seed": seed}
        if method != "sft":  # added after keys were published: an sft key holds no method
            config["method"] = method_identity(exp.train, method)
        up: tuple[str, ...] = (dataset.key,)
        if align == "batch":  # the training's own batch and budget, not train.mix_batch
            config["budget"] = {"align": align}
        elif align != "none" and reference is not None and reference.key != dataset.key:
            config["budget"] = {"align": align}
            up = (dataset.key, reference.key)
        key = cell_key("adapter", config, up, package_versions(TRAIN_PACKAGES))
        d, regime = dataset, regimes.row_regime(dataset.regime, align, method)
        return cls(key, config, up, d.model, d.task, d.teacher, regime, d.trace_seed, seed, method)


def method_identity(train: TrainConfig, method: str) -> dict[str, Any]:
    """A distillation method's name and settings, as an adapter's key holds them."""
    settings = {"kd": train.kd, "on_policy": train.on_policy}.get(method)
    return {"name": method, **(canonical(settings) if settings is not None else {})}


def _train_identity(exp: Experiment, own_batch: bool) -> dict[str, Any]:
    """What of the training config an adapter's key holds (the same for every adapter of a grid,
    but for the mix's own batch, `own_batch`)."""
    tr = exp.train
    settings = canonical(tr.model_copy(update={"seeds": (), "regimes": ()}))
    # how trace draws and training seeds combine is the grid's choice: the adapter's draw is in
    # its dataset's key, its seed in its own
    settings.pop("replicates")
    settings.pop("race")  # which replicates are trained is the grid's choice too
    # When to checkpoint is a runtime choice (a resumed run reaches the same weights): out of
    # the key. (checkpoint_every predates this rule and stays in the key.)
    settings.pop("checkpoint_seconds")
    settings.pop("gradient_checkpointing")  # the same weights, recomputed activations
    # added later: in the key only where they act (the method: `method_identity`)
    for name in ("mix", "mix_batch", "budget", "methods", "kd", "on_policy"):
        settings.pop(name)
    # which teachers are trained is the grid's choice, not the adapter's: out of the key
    settings.pop("teachers_per_student")
    settings.pop("top_k")
    settings.pop("filter_by")  # in the dataset's key (regimes.key_fields), when set
    settings.pop("filter_drop")
    if not settings["merge"]:
        settings.pop("merge")  # added after keys were published: left out at its old value
    if own_batch and tr.mix_batch:
        settings.update(canonical(tr.mix_batch))
    return settings


_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("cells_memo", default=None)


@contextlib.contextmanager
def shared_identities() -> Iterator[None]:
    """Within it, what every cell of one experiment shares (task identities, the canonical
    generate / evaluate / train settings) is computed once: a paper-scale grid builds ~20,000
    cells, and hashing the experiment for an lru_cache lookup each time costs seconds."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _shared(exp: Experiment, key: tuple, make: Callable[[], Any]) -> Any:
    memo = _MEMO.get()
    if memo is None:
        return make()
    hit = memo.get((id(exp), *key))
    if hit is None or hit[0] is not exp:  # the entry holds `exp`: its id is not reused meanwhile
        hit = memo[(id(exp), *key)] = (exp, make())
    return hit[1]


def _task(exp: Experiment, name: str, split: str) -> dict[str, Any]:
    return _shared(exp, ("task", name, split), lambda: task_identity(exp, name, split))


def engine_versions(engine: str, ident: dict | None = None) -> dict[str, str]:
    """The package versions that change what `engine` outputs for the model of `ident`; a
    served model (its identity names it) is answered by its server: no local package matters."""
    if ident is not None and "served" in ident:
        return {}
    if engine == "vllm":
        return {"vllm": vllm_version(), **package_versions(["transformers"])}
    return package_versions(["torch", "transformers", "peft"])


@functools.lru_cache(maxsize=4096)  # a large grid asks for a few identities thousands of times
def task_identity(exp: Experiment, name: str, split: str) -> dict[str, Any]:
    """What identifies a task's items and scoring in a key. The extractor's name (it picks the
    answer type), not its version: traces and eval cells keep their completions when extraction
    changes and are re-scored where they are read, so a version bump regenerates nothing."""
    from harness.tasks import suite as tasks

    ref, spec = exp.task(name), tasks.load_task(name)
    ident = {
        "name": name,
        "version": spec.version,
        "split": split,
        "limit": ref.train_limit if split == "train" else ref.test_limit,
        "extractor": exp.evaluate.extractor or spec.extractor,
    }
    generator = spec.source_version
    if generator not in (None, 1):  # added after keys were published: left out at its old value
        ident["source_version"] = generator
    return ident


def model_identities(exp: Experiment) -> dict[str, dict[str, Any]]:
    return {m.name: models.identity(m) for m in (*exp.teachers, *exp.students)}
