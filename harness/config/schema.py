"""The experiment schema: strict, frozen pydantic models, one per section of an experiment YAML.

    cotgap validate configs/sandbox.yaml

Every model forbids unknown keys and every float must be finite. Reading a file into these
models, with errors that name the file and key, is harness/config/loading.py; where task YAMLs
are found is harness/config/task_paths.py; the hash of a config in a cell key is
harness/config/hashing.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.errors import UserError


class Strict(BaseModel):
    # allow_inf_nan=False: every float of a config is a finite number (a nan or .inf edge, price
    # or weight validates nowhere and breaks whatever reads it)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


SEED_MAX = 2**32 - 1  # numpy's and accelerate's set_seed range: the training worker seeds both
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


def _no_duplicates(values: tuple[Any, ...]) -> tuple[Any, ...]:
    dupes = sorted({str(v) for i, v in enumerate(values) if v in values[:i]})
    if dupes:
        raise ValueError(f"{dupes} given more than once; list each once")
    return values


Distinct = AfterValidator(_no_duplicates)  # a list whose entries each say something new


class EngineSettings(Strict):
    """Passed through to vLLM (and to the transformers engine where it has a meaning)."""

    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    max_model_len: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    dtype: str = "auto"
    enforce_eager: bool | None = Field(
        None, description="None: CUDA graphs on a GPU (False), eager on a CPU (True)"
    )
    quantization: str | None = None


class OpenAIEndpoint(Strict):
    """A model served behind an OpenAI-compatible HTTP endpoint (vLLM's server, SGLang,
    llama.cpp's server, a hosted API): cotgap sends it requests instead of loading it."""

    kind: Literal["openai"] = Field(description="marks the entry as served")
    base_url: str = Field(description="the API root, e.g. http://localhost:8000/v1")
    model: str = Field(min_length=1, description="the served model's name, as the server calls it")
    endpoint: Literal["chat", "completions"] = Field(
        "chat",
        description="chat: the server applies its chat template; completions: cotgap renders the "
        "prompt (with the tokenizer at the entry's `path`, when given) and sends it as is",
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable holding the API key (never written anywhere); "
        "none: no key (a local server)",
    )
    max_concurrency: int = Field(8, ge=1, le=1024, description="requests in flight at once")
    requests_per_minute: float | None = Field(None, gt=0, description="client-side rate limit")
    tokens_per_minute: float | None = Field(
        None, gt=0, description="client-side limit on prompt + max_tokens x n per minute"
    )
    timeout_s: float = Field(600, gt=0, description="one request's limit before it is retried")
    max_attempts: int = Field(
        8, ge=1, le=100, description="attempts per request before it is recorded as failed"
    )
    vllm_extensions: bool = Field(
        False,
        description="also ask for vLLM's own fields (top_k, each choice's token ids): a vLLM "
        "server only; other servers refuse or ignore unknown fields",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
            raise ValueError(
                f"{url!r} is not an http(s) URL; give the API root, e.g. http://localhost:8000/v1"
            )
        return url.rstrip("/")


def _engine_kind(data: Any) -> str:
    # only a served model names its kind: an entry without `kind` is an engine cotgap runs
    kind = data.get("kind", "local") if isinstance(data, dict) else getattr(data, "kind", "local")
    return "openai" if kind == "openai" else "local" if kind == "local" else "unknown"


class Resources(Strict):
    """What one cell of this model needs from a scheduler (the Ray executor); None = derive from size."""

    gpus: float | None = Field(None, ge=0)
    cpus: float = Field(1, gt=0)
    memory_gb: float | None = Field(None, gt=0)


class ModelSpec(Strict):
    """A teacher or a student: a hub id, a local directory, `sandbox:<zoo model>` or
    `gguf:<package>` (a GGUF file shipped in a pip package, docs/real-models.md)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    path: str | None = None
    revision: str | None = None
    chat_template: bool = True
    size: float | None = Field(None, gt=0, description="parameters, for display and size analyses")
    trust_remote_code: bool = False
    engine: Annotated[
        Annotated[EngineSettings, Tag("local")] | Annotated[OpenAIEndpoint, Tag("openai")],
        Discriminator(
            _engine_kind,
            custom_error_type="engine_kind",
            custom_error_message="unknown engine kind: give kind: openai for a served model, or "
            "leave kind out for one cotgap runs itself (generate.engine / evaluate.engine)",
        ),
    ] = EngineSettings()
    resources: Resources = Resources()

    @model_validator(mode="after")
    def _path(self) -> ModelSpec:
        if self.path is None and not self.served:
            raise ValueError(
                f"model {self.name!r}: give its path (a directory, hub id or sandbox:<name>); only "
                "a served model (engine.kind: openai) may leave it out"
            )
        if (
            self.served
            and not self.path
            and self.engine.endpoint == "completions"
            and self.chat_template
        ):
            raise ValueError(
                f"model {self.name!r}: endpoint completions sends prompts as cotgap renders "
                "them, and without a `path` (a local copy of its tokenizer) cotgap cannot apply "
                "the chat template; give path, set chat_template: false, or use endpoint chat"
            )
        return self

    @property
    def served(self) -> bool:
        """Whether an OpenAI-compatible server runs this model (engine.kind: openai)."""
        return isinstance(self.engine, OpenAIEndpoint)


class TaskRef(Strict):
    name: str
    train_limit: int | None = Field(None, gt=0, description="first N train items (after the split)")
    test_limit: int | None = Field(None, gt=0, description="first N test items (after the split)")


PromptStyle = Literal["zero_shot_cot", "few_shot_cot"]


def vllm_installed() -> bool:
    """Whether `import vllm` can work here (found, not imported: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _engine(name: str) -> str:
    # "auto" resolves when the config is read, so cell keys hash the engine that will run:
    # vLLM where it is installed, else the transformers engine (macOS, aarch64, other Pythons).
    return ("vllm" if vllm_installed() else "hf") if name == "auto" else name


Engine = Annotated[Literal["auto", "vllm", "hf"], AfterValidator(_engine)]


class SamplingConfig(Strict):
    """What generating traces and evaluating share: the engine, the prompt, how to sample."""

    engine: Engine = Field("auto", validate_default=True)
    prompt_style: PromptStyle = "zero_shot_cot"
    num_fewshot: int = Field(0, ge=0)
    n: int = Field(1, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(512, gt=0)
    seed: Seed = 0
    stop: Annotated[tuple[str, ...], Distinct] = ()


class GenerateConfig(SamplingConfig):
    """How teacher traces are sampled. `seeds`: one trace-sampling replicate (a traces cell per
    task and teacher, and the datasets, adapters and evals that follow) per seed; without it,
    one draw at `seed`."""

    top_k: int = -1
    seeds: tuple[Seed, ...] | None = Field(
        None, description="trace-sampling replicates: one draw per seed (default: one at seed)"
    )

    @field_validator("seeds")
    @classmethod
    def _some(cls, seeds: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if seeds is not None and not seeds:
            raise ValueError("give at least one seed, or leave seeds out (one draw at seed)")
        return seeds if seeds is None else _distinct(seeds)

    @model_validator(mode="after")
    def _draws(self) -> GenerateConfig:
        # a value, not "was it given": a config dumped and read back gives seed: 0
        if self.seeds is not None and self.seed != 0:
            raise ValueError(
                f"give seed or seeds, not both: seeds lists every trace draw; move seed "
                f"{self.seed} into seeds (e.g. seeds: [{self.seed}, ...]) and leave seed out"
            )
        return self

    @property
    def trace_seeds(self) -> tuple[int, ...]:
        """The seed of every trace draw, in order."""
        return self.seeds if self.seeds is not None else (self.seed,)


def _distinct(seeds: tuple[int, ...]) -> tuple[int, ...]:
    dupes = sorted({s for s in seeds if seeds.count(s) > 1})
    if dupes:
        raise ValueError(f"{dupes} given more than once; list each seed once")
    return seeds


class LoraConfig(Strict):
    r: int = Field(8, gt=0)
    alpha: float = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: Annotated[tuple[str, ...], Distinct] = ("q_proj", "k_proj", "v_proj", "o_proj")


Regime = Literal["per_teacher", "intersection", "matched", "mix"]
Method = Literal["sft", "kd", "on_policy"]
Align = Literal["none", "updates", "tokens", "examples", "batch"]


class MixPart(Strict):
    """One teacher of the `mix` regime and its weight (parts of the mix, e.g. 1 large : 4 small)."""

    teacher: str
    weight: float = Field(gt=0, allow_inf_nan=False)


class MixBatch(Strict):
    """The batch the mix regime's adapters train with, where it differs from the training's own
    (Li et al.'s published mix configs: 5 per device x 4 accumulation against 2 x 1)."""

    per_device_batch_size: int = Field(gt=0)
    grad_accum: int = Field(1, gt=0)


class Budget(Strict):
    """How adapters of different regimes are made comparable. `none`: each trains its own config
    (max_steps or epochs over its own set, at its own batch). `updates`, `tokens`, `examples`:
    each adapter trains for as many optimizer updates as it takes to match the reference adapter
    (the per_teacher set of `reference`, same student, task and seed, at the training's batch)
    in updates, in tokens seen, or in examples seen. `batch`: the mix trains at the training's
    own batch (not train.mix_batch), its budget as configured, next to the single-teacher runs.
    Several names give one adapter per name."""

    align: tuple[Align, ...] = ("none",)
    reference: str | None = Field(
        None, description="a teacher's per_teacher set; default the first"
    )
    regimes: Annotated[tuple[Regime, ...], Distinct] | None = Field(
        None, description="the regimes aligned (default: every one); the others train as configured"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("align"), str):
            data = {**data, "align": [data["align"]]}
        return data

    @model_validator(mode="after")
    def _distinct(self) -> Budget:
        if not self.align or len(set(self.align)) != len(self.align):
            raise ValueError(
                "align: give each of none, updates, tokens, examples, batch at most once"
            )
        return self


class KdConfig(Strict):
    """The kd method: the student matches the teacher's next-token distribution on the teacher's
    traces, from the top-k log-probabilities captured while the traces were generated."""

    top_k: int = Field(20, gt=0, description="teacher log-probabilities kept per token")
    weight: float = Field(
        0.5, ge=0, le=1, description="loss = weight * forward KL + (1 - weight) * SFT loss"
    )


class OnPolicyConfig(Strict):
    """The on_policy method (GKD): the student samples completions of the training questions,
    the teacher scores every token, and the student minimises a divergence from the teacher."""

    divergence: Literal["reverse_kl", "jsd"] = Field(
        "jsd", description="reverse_kl: KL(student || teacher); jsd: generalized JSD with beta"
    )
    beta: float = Field(
        0.5, gt=0, lt=1, description="jsd's interpolation: 0 nears forward KL, 1 reverse KL"
    )
    teacher_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of micro-batches on the teacher's traces instead of student samples "
        "(GKD's lambda is 1 - teacher_share)",
    )
    temperature: float = Field(1.0, gt=0, description="the student's sampling temperature")
    max_new_tokens: int = Field(256, gt=0, description="longest sampled completion")


# a screen signal (ScreenConfig.signal's) or the teacher's own test accuracy
RacePrior = Literal["rsr", "nll", "mean_rank", "top1", "top5", "local_nll", "teacher_acc"]


class Race(Strict):
    """Race the teachers (harness/stats/racing.py): every teacher starts with `min_replicates`
    trace draws; after each round a teacher out of the best set and no longer needed against the
    baseline stops, the others get one more draw, until the group is decided or has
    `max_replicates` (generate.seeds lists that many draws). Off: every teacher gets every draw."""

    min_replicates: int = Field(
        ..., ge=2, description="trace draws every teacher gets before the first look"
    )
    max_replicates: int = Field(
        ..., ge=2, description="trace draws a contender gets at most: the number of generate.seeds"
    )
    prior: RacePrior | None = Field(
        None,
        description="rank each group's teachers before any training: a screen signal of their "
        "first trace draw (needs a `screen:` section) or teacher_acc (the teacher's own test "
        "accuracy), computed before any adapter; with start, it decides which teachers race",
    )
    start: int | None = Field(
        None,
        ge=1,
        description="with prior: how many of each group's teachers race, the best-ranked; the "
        "others are screened out (reported with their rank, never trained). Unset: all race",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Race:
        if self.min_replicates > self.max_replicates:
            raise ValueError(
                f"min_replicates {self.min_replicates} is above max_replicates "
                f"{self.max_replicates}; give a minimum at or below the maximum"
            )
        if self.start is not None and self.prior is None:
            raise ValueError(
                f"start: {self.start} needs a prior to rank the teachers by; add prior (e.g. "
                "mean_rank or teacher_acc) or drop start"
            )
        return self


class TrainConfig(Strict):
    method: Literal["lora", "full"] = "lora"
    methods: tuple[Method, ...] = Field(
        ("sft",),
        description="distillation methods, a grid axis: sft (the teacher's traces), kd (plus the "
        "teacher's top-k distribution), on_policy (student samples scored by the teacher)",
    )
    kd: KdConfig = Field(KdConfig(), description="the kd method's settings (kd in methods)")
    on_policy: OnPolicyConfig = Field(
        OnPolicyConfig(), description="the on_policy method's settings (on_policy in methods)"
    )
    lora: LoraConfig = LoraConfig()
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_steps: int | None = Field(None, gt=0)
    epochs: float | None = Field(None, gt=0)
    per_device_batch_size: int = Field(8, gt=0)
    grad_accum: int = Field(1, gt=0)
    num_processes: int = Field(1, gt=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    max_length: int = Field(512, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    seeds: tuple[Seed, ...] = (0,)
    replicates: Literal["crossed", "paired"] = Field(
        "crossed",
        description="crossed: every trace draw (generate.seeds) x every training seed; paired: "
        "the k-th trace seed with the k-th training seed",
    )
    race: Race | None = Field(
        None,
        description="race the teachers over rounds of trace draws: {min_replicates, "
        "max_replicates} (off: every teacher gets every replicate)",
    )
    regimes: Annotated[tuple[Regime, ...], Distinct] = ("per_teacher",)
    matched_by: Literal["examples", "tokens"] = "examples"
    mix: tuple[MixPart, ...] = Field((), description="the mix regime's teachers and weights")
    mix_batch: MixBatch | None = Field(
        None, description="the mix adapters' batch (default: train's)"
    )
    budget: Budget = Budget()
    checkpoint_every: int = Field(0, ge=0, description="0 = no intermediate checkpoints")
    checkpoint_seconds: float = Field(
        60, ge=0, description="checkpoint after this much training time (0 = never)"
    )
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 where the hardware has it natively, else fp32"
    )
    group_by_length: bool = True
    merge: bool = Field(
        False, description="also save the LoRA merged into the student (merged/); part of the key"
    )
    teachers_per_student: Literal["all", "top_k"] = Field(
        "all", description="top_k: screen first, train only the top_k best-screened teachers"
    )
    top_k: int = Field(1, gt=0, description="teachers trained per group with top_k")
    filter_by: Literal["nll", "mean_rank", "rsr"] | None = Field(
        None, description="drop the least learnable examples by this student-side signal"
    )
    filter_drop: float = Field(
        0.0, ge=0, lt=1, description="with filter_by: the share of each training set dropped"
    )
    accelerate_config: str | None = Field(
        None, description="accelerate YAML for multi-process runs"
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="recompute activations in the backward pass: less memory, ~1/3 more compute; "
        "auto: on for students of 1B parameters or more (a runtime choice: not in the key)",
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: tuple[int, ...]) -> tuple[int, ...]:
        return _distinct(seeds)

    @model_validator(mode="after")
    def _one_budget(self) -> TrainConfig:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError("set exactly one of max_steps or epochs (the training budget)")
        if ("mix" in self.regimes) != bool(self.mix):
            raise ValueError("the mix regime needs train.mix (two or more teachers), and only it")
        if self.mix and len({p.teacher for p in self.mix}) < 2:
            raise ValueError("mix: name two or more different teachers")
        # (a value, not "was it given": a config dumped and read back gives every field)
        if self.teachers_per_student == "all" and self.top_k != 1:
            raise ValueError("top_k is used only with teachers_per_student: top_k")
        if (self.filter_by is None) != (self.filter_drop == 0):
            raise ValueError("set filter_by and filter_drop > 0 together (per-item filtering)")
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError("methods: give each of sft, kd, on_policy at most once")
        for name, default in (("kd", KdConfig()), ("on_policy", OnPolicyConfig())):
            if getattr(self, name) != default and name not in self.methods:
                raise ValueError(f"train.{name} is used only with {name} in train.methods")
        if "on_policy" in self.methods and "mix" in self.regimes:
            raise ValueError(
                "methods: on_policy needs one teacher to score the student's samples; the mix "
                "regime has several: leave mix out of regimes or on_policy out of methods"
            )
        return self


class EvalConfig(SamplingConfig):
    """The one evaluation config: used identically for teachers, baselines and distilled students."""

    decoding: Literal["greedy", "self_consistency"] = "greedy"
    extractor: str | None = Field(None, description="override the task's extractor by name")
    answer_pass: bool = Field(
        False,
        description="greedy: ask the model once more, after its completion and 'Therefore, the "
        "answer is', where the completion gives no answer; reported as two_pass_accuracy",
    )

    @model_validator(mode="after")
    def _decoding(self) -> EvalConfig:
        if self.decoding == "greedy" and (self.n != 1 or self.temperature != 0):
            raise ValueError("decoding: greedy needs n: 1 and temperature: 0")
        if self.decoding == "self_consistency" and (self.n < 2 or self.temperature == 0):
            raise ValueError("decoding: self_consistency needs n >= 2 and temperature > 0")
        if self.answer_pass and self.decoding != "greedy":
            raise ValueError("answer_pass: needs decoding: greedy")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not self.answer_pass:  # off: left out, so that the keys of existing eval cells stay
            data.pop("answer_pass", None)
        return data


class Family(Strict):
    """A task family the studies average over: its name and its tasks' name patterns (fnmatch)."""

    name: str
    tasks: Annotated[tuple[str, ...], Distinct] = Field(
        min_length=1, description="task-name patterns, e.g. bbh_*"
    )


class AnalysisConfig(Strict):
    bootstrap_samples: int = Field(
        2000,
        ge=100,
        le=100_000,
        description="bootstrap resamples for intervals (each resamples every test item: memory "
        "and time grow with items x samples)",
    )
    ci: float = Field(0.95, gt=0, lt=1)
    seed: Seed = 0
    spread_threshold: float = Field(30.0, ge=0, description="teacher accuracy spread, in points")
    effect_of_interest: float = Field(
        3.0,
        gt=0,
        le=100,
        description="smallest gain worth acting on, in points: the equivalence margin and the bar "
        "a `none` answer must rule out",
    )
    min_replicates: int = Field(
        3,
        ge=2,
        description="replicates a teacher needs before any verdict but inconclusive (fewer: "
        "exploratory); with 2, the spread of two replicates is too unstable for the rule's "
        "error rates",
    )
    replicate_sd: float = Field(
        3.0,
        ge=0,
        description="prior SD of a teacher's post accuracy between replicates, in points: what "
        "`cotgap plan` assumes until replicates have run",
    )
    multiplicity: Literal["group"] = Field(
        "group",
        description="group: one simultaneous max-t family per (task, student, regime) group (any "
        "false better/worse in a group at most 1 - ci), the best set by multiple comparisons "
        "with the best",
    )
    delta_large: tuple[str, str] | None = Field(
        None,
        description="ΔLarge's teachers, [large, small] (Li et al. 2025 compare the 72B teacher "
        "with the 3B one); unset: the largest against the smallest",
    )
    delta_long: tuple[str, str] | None = Field(
        None,
        description="ΔLong's teachers, [long-CoT, short-CoT] of one size (Li et al. 2025: QwQ-32B "
        "against Qwen2.5-32B-Instruct); unset: not computed",
    )
    families: tuple[Family, ...] = Field(
        (),
        description="task families averaged in the studies (e.g. BBH); a task in none belongs to "
        "the family named by its name up to the first underscore",
    )
    gap_bins: tuple[float, ...] = Field(
        (0, 10, 20, 40, 100),
        min_length=2,
        description="edges of the teacher-accuracy-gap bins (points) of the stronger-teacher "
        "win rate, increasing",
    )

    @field_validator("multiplicity", mode="before")
    @classmethod
    def _multiplicity(cls, v: Any) -> Any:
        if v == "grid_fdr":
            raise ValueError(
                "grid_fdr is not offered: its false-discovery rate exceeded its q in simulation "
                "(9-14% at q = 5%); remove analysis.multiplicity, or set it to group (one "
                "family-wise family per decision group)"
            )
        return v

    @field_validator("gap_bins")
    @classmethod
    def _increasing(cls, edges: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"gap_bins must increase: {list(edges)}")
        return edges

    @model_validator(mode="after")
    def _distinct(self) -> AnalysisConfig:
        for key in ("delta_large", "delta_long"):
            pair = getattr(self, key)
            if pair is not None and pair[0] == pair[1]:
                raise ValueError(
                    f"{key}: [{pair[0]}, {pair[1]}] compares a teacher with itself; name two "
                    "different teachers"
                )
        _no_duplicates(tuple(f.name for f in self.families))
        return self


class SelectConfig(Strict):
    """Task pre-selection (Kajitsuka, Honda and Takase 2026, arXiv 2604.08880): before any trace,
    every teacher is evaluated on each task (`split`, few-shot CoT by default); a task goes on only
    when the teachers' accuracy spread (max - min, in points) reaches `min_points`. Selecting on
    the test split reads the items the study is scored on (a leak): train is the default, and
    test must be asked for."""

    by: Literal["teacher_spread"] = "teacher_spread"
    prompt_style: PromptStyle = "few_shot_cot"
    num_fewshot: int = Field(0, ge=0, description="0 = every exemplar of the task's few-shot file")
    min_points: float = Field(30.0, ge=0, le=100)
    split: Literal["train", "test"] = "train"
    limit: int | None = Field(None, gt=0, description="items per task (default: the split's limit)")
    run_gated: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of gated tasks run anyway (each picked by a hash of its name), so "
        "the report can set their gains against the selected tasks'",
    )


class ScreenConfig(Strict):
    """Student-side screening of teacher traces (harness/stages/screen.py): one forward pass of each
    student over each training set, no training. Present: the grid has a screen cell per dataset."""

    batch_size: int = Field(
        64,
        gt=0,
        description="examples per forward pass, at most (not in any key; harness/stages/screen.py)",
    )
    max_examples: int | None = Field(
        None, gt=0, description="screen a seeded sample of this many examples (None: all of them)"
    )
    local_window: int = Field(
        0, ge=0, description="local naturalness: score each step after this many steps (0: off)"
    )
    signal: Literal["rsr", "nll", "mean_rank", "top1", "top5", "local_nll"] = Field(
        "rsr", description="the signal that ranks teachers (harness/analysis/screening.py: SIGNALS)"
    )

    @model_validator(mode="after")
    def _local(self) -> ScreenConfig:
        if self.signal == "local_nll" and not self.local_window:
            raise ValueError("signal: local_nll needs local_window > 0")
        return self


class RayConfig(Strict):
    address: str | None = None
    max_retries: int = Field(2, ge=0)


class MlflowTracking(Strict):
    uri: str = Field(
        "file:mlruns",
        description="local file store (no server); a relative path is under <results_dir>/<name>",
    )
    experiment: str | None = Field(None, description="MLflow experiment name (default: the grid's)")

    @field_validator("uri")
    @classmethod
    def _file_store(cls, uri: str) -> str:
        if not uri.startswith("file:"):
            raise ValueError(f"{uri!r} is not a local file store; give file:<directory>")
        return uri


class WandbTracking(Strict):
    project: str = Field("cotgap", min_length=1)
    dir: str = Field(
        "wandb", description="offline run files; a relative path is under <results_dir>/<name>"
    )


class TrackingConfig(Strict):
    """Off unless a section is given: `tracking: {mlflow: {}}` logs every complete cell."""

    mlflow: MlflowTracking | None = None
    wandb: WandbTracking | None = None


class Throughput(Strict):
    """Measured tokens per second per GPU of one model (replaces the estimate in harness/workflow/estimate.py)."""

    model: str = Field(description="a teacher's or student's name")
    generate: float | None = Field(None, gt=0, description="generated tokens/s per GPU (vLLM)")
    train: float | None = Field(None, gt=0, description="trained tokens/s per GPU")


class Price(Strict):
    """What a model's tokens cost, per million (any currency; every price of a config in the same)."""

    model: str = Field(description="a teacher's or student's name")
    input_per_million: float = Field(ge=0, description="per million prompt tokens")
    output_per_million: float = Field(ge=0, description="per million completion tokens")


class CostConfig(Strict):
    """What `cotgap plan` prices the run with: the GPUs, and the throughput it assumes
    (harness/workflow/estimate.py: FLOPs per token at these utilisations, unless `throughput` names a model)."""

    gpu_memory_gb: float = Field(80, gt=0, description="memory of one GPU")
    peak_tflops: float = Field(989, gt=0, description="bf16 dense TFLOP/s of one GPU (H100 SXM)")
    generate_utilisation: float = Field(0.15, gt=0, le=1, description="share of peak, generation")
    train_utilisation: float = Field(0.35, gt=0, le=1, description="share of peak, training")
    throughput: tuple[Throughput, ...] = Field((), description="measured figures of some models")
    prices: tuple[Price, ...] = Field(
        (), description="token prices of served models: the leaderboard's cost columns"
    )
    device_hour: float | None = Field(
        None,
        ge=0,
        description="what one device-hour of cotgap's own engines and training costs, in the "
        "prices' currency: in-process generation and training enter the cost columns at this rate",
    )


class Experiment(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    results_dir: str = Field("results", description="relative to the experiment YAML file")
    data_dir: str | None = Field(
        None, description="the original benchmark files; relative to the experiment YAML file"
    )
    task_paths: Annotated[tuple[str, ...], Distinct] = Field(
        (),
        description="folders of your own task YAMLs, searched before the built-in tasks; "
        "relative to the experiment YAML file",
    )
    executor: Literal["local", "ray"] = "local"
    ray: RayConfig = RayConfig()
    teachers: tuple[ModelSpec, ...] = Field(min_length=1)
    students: tuple[ModelSpec, ...] = Field(min_length=1)
    tasks: tuple[TaskRef, ...] = Field(min_length=1)
    generate: GenerateConfig = GenerateConfig()
    train: TrainConfig
    evaluate: EvalConfig = EvalConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    select: SelectConfig | None = None
    screen: ScreenConfig | None = None
    tracking: TrackingConfig = TrackingConfig()
    costs: CostConfig = CostConfig()

    @model_validator(mode="before")
    @classmethod
    def _task_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("tasks"), list):
            data = {
                **data,
                "tasks": [{"name": t} if isinstance(t, str) else t for t in data["tasks"]],
            }
        return data

    @model_validator(mode="after")
    def _unique_names(self) -> Experiment:
        names = [m.name for m in (*self.teachers, *self.students)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique across teachers and students: {dupes}")
        tasks = [t.name for t in self.tasks]
        if len(set(tasks)) != len(tasks):
            raise ValueError("task names must be unique")
        teachers = [t.name for t in self.teachers]
        named = [p.teacher for p in self.train.mix] + [self.train.budget.reference]
        wrong = sorted({n for n in named if n is not None and n not in teachers})
        if wrong:
            raise ValueError(
                f"train.mix / train.budget.reference: not a teacher: {wrong}; teachers: {teachers}"
            )
        pairs = [*(self.analysis.delta_large or ()), *(self.analysis.delta_long or ())]
        wrong = sorted({n for n in pairs if n not in teachers})
        if wrong:
            raise ValueError(
                f"analysis.delta_large / analysis.delta_long: not a teacher: {wrong}; "
                f"teachers: {teachers}"
            )
        return self

    @model_validator(mode="after")
    def _paired(self) -> Experiment:
        draws, seeds = self.generate.trace_seeds, self.train.seeds
        if self.train.replicates == "paired" and len(draws) != len(seeds):
            raise ValueError(
                f"train.replicates: paired trains the k-th trace draw (generate.seeds) with the "
                f"k-th training seed (train.seeds), but there are {len(draws)} trace draw(s) and "
                f"{len(seeds)} training seed(s); give both lists the same length, or use crossed"
            )
        return self

    def replicate_warnings(self) -> list[str]:
        """What `validate` warns about the replicates (not errors: the grid still runs)."""
        draws, seeds = self.generate.trace_seeds, self.train.seeds
        if len(draws) == 1 and len(seeds) > 1:
            return [
                f"the replicates are {len(seeds)} training seeds on one trace draw "
                f"(generate.seed {draws[0]}): the teachers' intervals leave out trace-sampling "
                "variance, so an answer about a teacher can rest on one draw of its traces; "
                f"set generate.seeds to {len(seeds)} seeds and train.replicates: paired"
            ]
        return []

    def replicates(self) -> list[tuple[int, int]]:
        """Every (trace seed, training seed) replicate of a (task, student, teacher, regime), in
        order: crossed (every pair) or paired (the k-th of each)."""
        draws, seeds = self.generate.trace_seeds, self.train.seeds
        if self.train.replicates == "paired":
            return list(zip(draws, seeds, strict=True))
        return [(d, s) for d in draws for s in seeds]

    @model_validator(mode="after")
    def _race_prior(self) -> Experiment:
        race = self.train.race
        if race is None or race.prior is None:
            return self
        if race.prior != "teacher_acc" and self.screen is None:
            raise ValueError(
                f"train.race.prior: {race.prior} is a screen signal, and this config has no "
                "`screen:` section to compute it; add `screen: {}` (one forward pass of each "
                "student over each training set) or use prior: teacher_acc"
            )
        if race.prior == "local_nll" and not (self.screen and self.screen.local_window):
            raise ValueError("train.race.prior: local_nll needs screen.local_window > 0")
        if race.start is not None and race.start > len(self.teachers):
            raise ValueError(
                f"train.race.start: {race.start} is more than the {len(self.teachers)} teachers; "
                "give at most that many (or drop start: every teacher races)"
            )
        return self

    @model_validator(mode="after")
    def _cost_models(self) -> Experiment:
        names = {m.name for m in (*self.teachers, *self.students)}
        for part in ("throughput", "prices"):
            given = [t.model for t in getattr(self.costs, part)]
            wrong = sorted(set(given) - names)
            if wrong:
                raise ValueError(f"costs.{part}: not a model of this experiment: {wrong}")
            dupes = sorted({n for n in given if given.count(n) > 1})
            if dupes:
                raise ValueError(f"costs.{part}: {dupes} given more than once; keep one entry")
        served = [m.name for m in self.students if m.served]
        if served:
            raise ValueError(
                f"students {served}: a student is fine-tuned by cotgap, so it runs in-process; "
                "only a teacher may be a served model (engine.kind: openai)"
            )
        return self

    def price(self, model: str) -> Price | None:
        """The price entry of `model`, if the config gives one."""
        return next((p for p in self.costs.prices if p.model == model), None)

    def model(self, name: str) -> ModelSpec:
        for m in (*self.teachers, *self.students):
            if m.name == name:
                return m
        valid = [m.name for m in (*self.teachers, *self.students)]
        raise UserError(f"no model named {name!r} in experiment {self.name!r}; valid: {valid}")

    def task(self, name: str) -> TaskRef:
        for t in self.tasks:
            if t.name == name:
                return t
        raise UserError(
            f"no task named {name!r} in experiment {self.name!r}; valid: {[t.name for t in self.tasks]}"
        )

    @property
    def root(self) -> Path:
        """Results of this experiment: <results_dir>/<name>."""
        return Path(self.results_dir) / self.name
