"""A zoo of tiny Llama models with the character tokenizer, pretrained from scratch on CPU.

    cotgap sandbox verify                     # the shipped zoo: sha256 of every file (< 1 s)
    cotgap sandbox build                      # rebuild the demo zoo from scratch into the cache
    cotgap sandbox build --check              # ... and compare its accuracies with the shipped one

The built zoo ships inside the package (`harness/sandbox/models/`, MODEL_CARD.md there): a demo's
numbers must not depend on the CPU it runs on, and pretraining takes minutes on a fast CPU and far
longer on one without native bf16. `sandbox:<name>` means the shipped model, each file checked
against SHA256SUMS when first used; a shipped model whose recipe hash no longer matches the code is
ignored, and the model is then looked up in (or built into) the cache like any rebuild. With
COTGAP_ZOO=rebuilt, `sandbox:<name>` means the rebuild in the cache instead.

Each model is a standard Hugging Face directory (config.json, model.safetensors, tokenizer files,
generation_config.json with the EOS) that transformers and vLLM load, plus `zoo.json`: the recipe,
the precision it was trained in, steps, tokens, wall time and greedy accuracies on held-out test
items of every task. A rebuilt directory is named by a hash of its recipe and this code's version,
`<zoo_dir>/<name>-<hash12>`; it is trained in a temporary directory and renamed when complete, so a
second build finds it and returns at once. The precision follows `harness.precision.choose()`
(bf16 autocast where the CPU has native bf16, fp32 elsewhere; COTGAP_PRECISION forces one).

Pretraining data are the sandbox tasks' train items (question as the user message, rationale as the
assistant message, rendered with the chat template), drawn with a seed of their own; the tasks'
split rule keeps every test question out of them. The loss covers the assistant part only: the
questions are uniformly random digits, names and words, so predicting them teaches nothing the
models are later asked to do and only adds noise to the gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.hashing import config_hash
from harness.errors import UserError
from harness.sandbox import tasks
from harness.sandbox.tokenizer import ASSISTANT, END, PAD, USER, make_tokenizer, vocab

ZOO_VERSION = 2  # bump when training, evaluation or the saved format change
# Pretraining items use seed PRETRAIN_SEED + recipe.seed, apart from the tasks' seeds; the split rule
# in `tasks` keeps test questions out of them whatever the seed.
PRETRAIN_SEED = 1_000_000
EVAL_SEED = 1234  # the seed of tasks/sandbox_*.yaml: zoo.json scores the first test items they use
MAX_NEW_TOKENS = 160
ANSWER_RE = re.compile(r"The answer is (\S+?)\.\s*$")

# Shares of items of each generator in the pretraining stream. In tokens that is about 45% addition,
# 25% coin_flip (long items), 15% each for the others: addition is where capacity and training
# length show within the build budget, and a larger share made it learnt sooner (measured).
MIXTURE = (("addition", 0.55), ("expressions", 0.2), ("last_letters", 0.14), ("coin_flip", 0.11))
THREADS = 2  # the demo machine has 2 cores


@dataclass(frozen=True)
class Recipe:
    """Everything that decides a zoo model's weights (and, with the code version, its hash)."""

    role: str  # "teacher" or "student": for display and for picking grids
    profile: str  # "demo" or "test": which zoo `build(profile=...)` builds
    hidden: int
    layers: int
    heads: int
    intermediate: int
    steps: int
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 30
    mixture: tuple[tuple[str, float], ...] = MIXTURE
    seed: int = 0
    eval_items: int = 100
    # the rationale styles it learns (tasks.STYLES), each generator's share split evenly among the
    # ones it has; a generator with none of them is written in its default style
    styles: tuple[str, ...] = ("fine",)


# The demo's world: two tasks, sums (1-2 digit addition) and coin flip. Each teacher learns one
# way of writing a sum (tasks.STYLES): teacher-s and teacher-m `fine` columns (a small and a large
# model: the same chains), teacher-l `long` (fine's columns, each followed by the answer so far,
# on teacher-m's architecture). The students learn all three styles, long the most (half of their
# sums, as a corpus holds mostly long reasoning), so with no distillation they pick one themselves
# (greedy: often chunk, two digits at a time, which they cannot do); a teacher's traces teach them
# one. Their only difference is size: student-xs has one layer, and one layer cannot copy a
# string forward (no induction head), which long needs at every step; student-s has two, and long
# is the style it has practised most. Coin flip is the same for every teacher. What the demo
# measures of this world is in MODEL_CARD.md (its ground truth) and docs/sandbox.md. Sizes: a
# head dimension of 32 (vLLM's CPU attention has no kernel for 24), steps where the students sit
# between the floor and the teachers (measured: benchmarks/README.md, "The sandbox's styles").
DEMO_MIXTURE = (("sums", 0.7), ("coin_flip", 0.3))
_STUDENT_STYLES = ("fine", "chunk", "long", "long")
ZOO: dict[str, Recipe] = {
    "teacher-l": Recipe("teacher", "demo", hidden=96, layers=3, heads=3, intermediate=384, steps=2000, mixture=DEMO_MIXTURE, styles=("long",)),
    "teacher-m": Recipe("teacher", "demo", hidden=96, layers=3, heads=3, intermediate=384, steps=2000, mixture=DEMO_MIXTURE, styles=("fine",)),
    "teacher-s": Recipe("teacher", "demo", hidden=64, layers=2, heads=2, intermediate=256, steps=2000, mixture=DEMO_MIXTURE, styles=("fine",)),
    "student-s": Recipe("student", "demo", hidden=64, layers=2, heads=2, intermediate=256, steps=2000, mixture=DEMO_MIXTURE, styles=_STUDENT_STYLES),
    "student-xs": Recipe("student", "demo", hidden=64, layers=1, heads=2, intermediate=256, steps=3000, mixture=DEMO_MIXTURE, styles=_STUDENT_STYLES),
    "test-teacher-l": Recipe("teacher", "test", hidden=64, layers=2, heads=2, intermediate=256, steps=1500),
    "test-teacher-s": Recipe("teacher", "test", hidden=64, layers=2, heads=2, intermediate=256, steps=500),
    "test-student": Recipe("student", "test", hidden=64, layers=2, heads=2, intermediate=128, steps=450),
}  # fmt: skip
PROFILES = ("demo", "test")


SHIPPED = Path(__file__).resolve().parent / "models"  # the built zoo, shipped with the package
SUMS = "SHA256SUMS"
TRUTH = "TRUTH.md"  # the demo's ground truth, measured on these models: appended to the model card
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "zoo.json")


def zoo_dir() -> Path:
    """Where rebuilt models go: $COTGAP_ZOO_DIR, else ~/.cache/cotgap/zoo."""
    return Path(os.environ.get("COTGAP_ZOO_DIR") or Path.home() / ".cache" / "cotgap" / "zoo")


def _recipe(name: str, seed: int | None = None) -> Recipe:
    """The recipe of `name`; `seed` replaces its seed (a rebuild with another seed)."""
    if name not in ZOO:
        raise UserError(f"unknown sandbox model {name!r}; valid: {', '.join(ZOO)}.")
    return ZOO[name] if seed is None else dataclasses.replace(ZOO[name], seed=seed)


def recipe_hash(name: str, seed: int | None = None) -> str:
    """12 hex digits over the recipe and the versions of this code and of the tasks."""
    recipe = dataclasses.asdict(_recipe(name, seed))
    if recipe["styles"] == ["fine"] or recipe["styles"] == ("fine",):
        del recipe["styles"]  # the default: the hash of a recipe from before styles is kept
    return config_hash({"recipe": recipe, "zoo": ZOO_VERSION, "tasks": tasks.VERSION})[:12]


def _shipped_sums() -> dict[str, str]:
    """`<name>/<file>` -> sha256, from the shipped SHA256SUMS (empty when nothing is shipped)."""
    path = SHIPPED / SUMS
    if not path.is_file():
        return {}
    lines = (line.partition("  ") for line in path.read_text().splitlines())
    return {rel.strip(): digest.strip() for digest, _, rel in lines}


def shipped(name: str) -> Path | None:
    """The shipped directory of `name` when it was built from today's recipe, else None (also
    with COTGAP_ZOO=rebuilt: then `sandbox:<name>` means this machine's own rebuild)."""
    if os.environ.get("COTGAP_ZOO", "shipped").lower() == "rebuilt":
        return None
    info = _shipped_info(name)
    return SHIPPED / name if info and info.get("hash") == recipe_hash(name) else None


@functools.cache
def verify_shipped(name: str) -> str:
    """Check every shipped file of `name` against SHA256SUMS (once per process); return the
    weights' sha256. A mismatch is a UserError that says how to restore the file."""
    from harness.store import sha256_file

    sums, d = _shipped_sums(), SHIPPED / name
    listed = [rel.partition("/")[2] for rel in sums if rel.startswith(f"{name}/")]
    for f in sorted({*listed, *_REQUIRED}):
        want, path = sums.get(f"{name}/{f}"), d / f
        got = sha256_file(path) if path.is_file() else None
        if want is None or got != want:
            raise UserError(
                f"shipped sandbox model {name!r}: {path} "
                + ("is missing" if got is None else "does not match its sha256 in " + SUMS)
                + f" ({SHIPPED / SUMS}); restore it with `git checkout -- {d}` (or reinstall "
                "cotgap), or rebuild the zoo with `cotgap sandbox build`."
            )
    return sums[f"{name}/model.safetensors"]


def model_dir(name: str, root: Path | None = None) -> Path:
    """The shipped model (when it matches the recipe and no `root` is given), else the rebuilt
    one under `root` (default `zoo_dir()`)."""
    _recipe(name)
    if root is None and (d := shipped(name)) is not None:
        return d
    return (root or zoo_dir()) / f"{name}-{recipe_hash(name)}"


def model_id(name: str) -> str:
    """What identifies the model in cell keys: its recipe, and the weights' sha256 when shipped."""
    base = f"sandbox:{name}@{recipe_hash(name)}"
    return f"{base}/sha256:{verify_shipped(name)[:16]}" if shipped(name) else base


def is_built(name: str, root: Path | None = None) -> bool:
    return (model_dir(name, root) / "zoo.json").is_file()


def names_for(profile: str) -> list[str]:
    if profile not in PROFILES:
        raise UserError(f"unknown zoo profile {profile!r}; valid: {', '.join(PROFILES)}.")
    return [n for n, r in ZOO.items() if r.profile == profile]


def build(
    names: list[str] | None = None,
    progress: bool = True,
    profile: str = "demo",
    root: Path | None = None,
    rebuild: bool = False,
    seed: int | None = None,
) -> dict[str, Path]:
    """Every model's directory for `names` (default: every model of `profile`): the verified
    shipped model where there is one, unless `rebuild` or a `root` is given; otherwise a build
    under `root` (default `zoo_dir()`), cached by recipe hash. A file lock per model lets
    concurrent builders share one zoo: the second waits, then finds the model built. `seed`
    replaces every recipe's seed (a rebuild, never the shipped model)."""
    from filelock import FileLock

    if "torch" not in sys.modules:
        # OpenMP threads that sleep rather than spin while waiting: with 2 threads on 2 cores and any
        # other busy process, spinning made training steps 50x slower (measured); read at torch import.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    names = list(names) if names is not None else names_for(profile)
    for name in names:
        _recipe(name)
    out: dict[str, Path] = {}
    if root is None and not rebuild and seed is None:
        for name in names:
            if (d := shipped(name)) is not None:
                verify_shipped(name)
                out[name] = d
    root = Path(root or zoo_dir())
    todo = [n for n in names if n not in out]
    if todo:
        root.mkdir(parents=True, exist_ok=True)
    for name in todo:
        final = root / f"{name}-{recipe_hash(name, seed)}"
        with FileLock(str(root / f".{final.name}.lock")):
            if not (final / "zoo.json").is_file():
                _build_one(name, seed, final, progress)
        out[name] = final
    return {n: out[n] for n in names}


def _build_one(name: str, seed: int | None, final: Path, progress: bool) -> None:
    # left by a killed build; we hold the lock
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    try:
        info = _train_and_save(name, seed, tmp, progress)
        from harness.store import atomic_write_json

        atomic_write_json(tmp / "zoo.json", info)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- data -----------------------------------------------------------------------------------------


def encode_example(question: str, rationale: str | None = None) -> tuple[list[int], int]:
    """Token ids of the chat-template rendering and the index of the first assistant token: the
    same ids as `tokenizer.apply_chat_template` (tests check it), without a Jinja render per item."""
    v = vocab()
    ids = [v[USER], *(v[c] for c in question), v[END], v[ASSISTANT]]
    start = len(ids)
    if rationale is not None:
        ids += [*(v[c] for c in rationale), v[END]]
    return ids, start


def pretraining_texts(recipe: Recipe) -> list[tuple[str, str]]:
    """(question, rationale) pairs, enough for every step, mixed in a seeded order."""
    total = recipe.steps * recipe.batch_size
    weights = sum(w for _, w in recipe.mixture)
    pairs = []
    for gen, w in recipe.mixture:
        styles = [st for st in recipe.styles if st in tasks.styles_of(gen)] or ["fine"]
        for k, style in enumerate(styles):
            # each style its own questions (seed offset k), so no question is seen twice
            n = math.ceil(total * w / weights / len(styles))
            step = tasks.GENERATORS[gen].draw or n
            for r, first in enumerate(range(0, n, step)):  # one draw unless the generator is small
                seed = PRETRAIN_SEED + recipe.seed + k + 1000 * r
                items = tasks.generate_items(gen, "train", min(step, n - first), seed, style)
                pairs += [(it["question"], it["rationale"]) for it in items]
    random.Random(recipe.seed).shuffle(pairs)
    return pairs[:total]


def _batches(recipe: Recipe) -> Iterator[tuple[Any, Any, int]]:
    """Right-padded (input_ids, labels, real tokens) batches of similar lengths: chunks of 32
    batches are sorted by length, cut, and the batches shuffled, so padding stays small."""
    import torch

    examples = [encode_example(q, r) for q, r in pretraining_texts(recipe)]
    rng = random.Random(recipe.seed + 1)
    bs, chunk = recipe.batch_size, 32 * recipe.batch_size
    pad = vocab()[PAD]
    for c in range(0, len(examples), chunk):
        part = sorted(examples[c : c + chunk], key=lambda e: len(e[0]))
        batches = [part[i : i + bs] for i in range(0, len(part), bs)]
        rng.shuffle(batches)
        for batch in batches:
            # widths rounded up to a multiple of 16: few distinct shapes, so oneDNN's bf16 kernels
            # are compiled once per shape rather than once per batch
            width = -(-max(len(ids) for ids, _ in batch) // 16) * 16
            ids = torch.full((len(batch), width), pad)
            labels = torch.full((len(batch), width), -100)
            for row, (seq, start) in enumerate(batch):
                ids[row, : len(seq)] = torch.tensor(seq)
                labels[row, start : len(seq)] = ids[row, start : len(seq)]
            yield ids, labels, sum(len(seq) for seq, _ in batch)


# --- training -------------------------------------------------------------------------------------


def _make_model(recipe: Recipe):
    from transformers import LlamaConfig, LlamaForCausalLM

    v = vocab()
    cfg = LlamaConfig(
        vocab_size=len(v),
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=v[END],
        pad_token_id=v[PAD],
    )
    # eager attention trains ~1.5x faster than sdpa under bf16 autocast on these cores (measured);
    # it is not saved in config.json, so loaders pick their own.
    return LlamaForCausalLM._from_config(cfg, attn_implementation="eager")


def _lr_at(step: int, recipe: Recipe) -> float:
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _train_and_save(name: str, seed: int | None, out: Path, progress: bool) -> dict:
    """Pretrain, evaluate, save a standard model directory into `out`; return zoo.json's content.
    With `progress`, a bar while pretraining (steps, tokens/s, loss), then a line of accuracies."""
    import torch
    import transformers
    from transformers import GenerationConfig

    from harness import precision as prec

    recipe = _recipe(name, seed)
    precision = prec.choose()
    transformers.utils.logging.disable_progress_bar()
    saved_threads, threads = torch.get_num_threads(), min(THREADS, os.cpu_count() or 1)
    torch.set_num_threads(threads)  # the weights depend on it (reduction order): recorded below
    try:
        start = time.time()
        model, stats = _pretrain(name, recipe, precision, progress)
        tokenizer = make_tokenizer()
        accuracy = evaluate(model, tokenizer, [g for g, _ in recipe.mixture], recipe.eval_items)
        if progress:
            scores = "  ".join(f"{g} {a:.0%}" for g, a in accuracy.items())
            print(f"  zoo {name}: built; accuracy {scores}", file=sys.stderr, flush=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
        GenerationConfig(**ids, do_sample=False).save_pretrained(out)
    finally:
        torch.set_num_threads(saved_threads)
    return {
        "name": name,
        "model_id": f"sandbox:{name}@{recipe_hash(name, seed)}",
        "hash": recipe_hash(name, seed),
        "recipe": dataclasses.asdict(recipe),
        **stats,
        "threads": threads,
        "precision": precision,
        "precision_choice": prec.describe(),
        "wall_s": round(time.time() - start, 1),
        "accuracy": accuracy,
        "eval": {
            "split": "test",
            "seed": EVAL_SEED,
            "items": recipe.eval_items,
            "decoding": "greedy",
        },
        "versions": {
            "zoo": ZOO_VERSION,
            "tasks": tasks.VERSION,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }


def _pretrain(
    name: str, recipe: Recipe, precision: str = "fp32", progress: bool = False
) -> tuple[Any, dict]:
    """AdamW with warmup and cosine decay to 10%, loss on the assistant tokens; bf16 autocast
    when `precision` is "bf16" (weights and optimizer stay fp32 either way)."""
    import torch

    from harness.progress import StageProgress

    torch.manual_seed(recipe.seed)
    start = time.time()
    model = _make_model(recipe)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    tokens = loss_ema = 0.0
    with StageProgress(f"zoo {name} ({params / 1e6:.2f}M params)", progress, "steps") as bar:
        bar.update({"total": recipe.steps})
        for step, (ids, labels, n_tokens) in enumerate(_batches(recipe)):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, recipe)
            # bf16 autocast: ~1.5x faster than fp32 where bf16 is native, ~6x slower where emulated
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tokens += n_tokens
            loss_ema = loss.item() if step == 0 else 0.95 * loss_ema + 0.05 * loss.item()
            bar.update({"fields": f"loss {loss_ema:.3f}", "samples": 1, "tokens": n_tokens})
    model.eval()
    stats = {
        "params": params,
        "steps": recipe.steps,
        "examples": recipe.steps * recipe.batch_size,
        "tokens": int(tokens),
        "final_loss": round(loss_ema, 4),
        "train_s": round(time.time() - start, 1),
    }
    return model, stats


# --- evaluation -----------------------------------------------------------------------------------


def extract_answer(completion: str) -> str | None:
    match = ANSWER_RE.search(completion)
    return match.group(1) if match else None


def evaluate(
    model, tokenizer, generators: list[str], n: int, batch_size: int = 100
) -> dict[str, float]:
    """Greedy accuracy on the first `n` test items (seed EVAL_SEED) of each generator: the question
    as the user message through the chat template, answer read from `The answer is X.`"""
    return {
        gen: round(accuracy(model, tokenizer, tasks.generate_items(gen, "test", n, EVAL_SEED)), 3)
        for gen in generators
    }


def accuracy(
    model, tokenizer, items: list[dict], batch_size: int = 100, prefix: str = "",
    logits_processor: Any = None,
) -> float:  # fmt: skip
    """The share of `items` answered right, greedy. `prefix`: text the answer is made to start
    with; `logits_processor`: a transformers LogitsProcessorList for `generate` (its first step
    is at the prompt's padded width); both for forcing a style (benchmarks/sandbox_styles.py)."""
    import torch

    v, pad = vocab(), tokenizer.pad_token_id
    correct = 0
    for b in range(0, len(items), batch_size):
        batch = items[b : b + batch_size]
        prompts = [encode_example(it["question"])[0] + [v[c] for c in prefix] for it in batch]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=pad,
                logits_processor=logits_processor,
            )
        texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        pairs = zip(texts, batch, strict=True)
        correct += sum(extract_answer(t) == it["answer"] for t, it in pairs)
    return correct / len(items)


# --- CLI -----------------------------------------------------------------------------------------


def build_cli(
    names: list[str] | None,
    profile: str,
    check: bool = False,
    ship: bool = False,
    seed: int | None = None,
):
    """`cotgap sandbox build [NAMES...] --profile demo|test [--check] [--ship]`: rebuild from
    scratch into the cache, print the table; `--check` adds the shipped model's accuracies and
    the differences, `--ship` (for maintainers) replaces the shipped models with the rebuild."""
    from rich.table import Table

    from harness.progress import console

    if ship and seed is not None:
        raise UserError("--ship takes the recipes' own seeds; drop --seed.")
    dirs = build(names or None, progress=True, profile=profile, rebuild=True, seed=seed)
    table = Table(title=f"sandbox zoo, rebuilt in {zoo_dir()}")
    cols = ["model", "role", "params", "precision", "train s", "accuracy"]
    cols += ["shipped accuracy", "difference (points)"] if check else ["directory"]
    for col in cols:
        table.add_column(col)
    for name, path in dirs.items():
        info = json.loads((path / "zoo.json").read_text())
        acc = info["accuracy"]
        row = [name, info["recipe"]["role"], f"{info['params'] / 1e6:.2f}M"]
        row += [info.get("precision", "?"), f"{info['train_s']:.0f}", _scores(acc)]
        if check:
            old = _shipped_info(name)
            if old is None:
                row += ["(none shipped)", ""]
            else:
                diff = {g: round(100 * (acc[g] - old["accuracy"][g])) for g in acc}
                row += [_scores(old["accuracy"]), " ".join(f"{g}={d:+d}" for g, d in diff.items())]
        else:
            row.append(str(path))
        table.add_row(*row)
    console().print(table)
    if ship:
        ship_models(dirs)
        console().print(f"shipped {len(dirs)} models to {SHIPPED} (SHA256SUMS, MODEL_CARD.md)")


def _scores(acc: dict[str, float]) -> str:
    return " ".join(f"{g}={a:.0%}" for g, a in acc.items())


def _shipped_info(name: str) -> dict | None:
    info = SHIPPED / name / "zoo.json"
    return json.loads(info.read_text()) if info.is_file() else None


def ship_models(dirs: dict[str, Path]) -> None:
    """Copy built models into the package, then rewrite SHA256SUMS and MODEL_CARD.md."""
    from harness.store import atomic_write_text, sha256_file

    for name, src in dirs.items():
        dst = SHIPPED / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, dst / f.name)
    models = sorted(p.name for p in SHIPPED.iterdir() if (p / "zoo.json").is_file())
    sums = [
        f"{sha256_file(f)}  {n}/{f.name}"
        for n in models
        for f in sorted((SHIPPED / n).iterdir())
        if f.is_file()
    ]
    atomic_write_text(SHIPPED / SUMS, "\n".join(sums) + "\n")
    atomic_write_text(SHIPPED / "MODEL_CARD.md", _model_card(models))
    verify_shipped.cache_clear()


def _model_card(models: list[str]) -> str:
    # `models` holds only shipped directories with a zoo.json
    infos = {n: _shipped_info(n) or {} for n in models}
    rows = []
    for n, info in infos.items():
        r = info["recipe"]
        arch = f"{r['layers']}L h{r['hidden']} ff{r['intermediate']} heads {r['heads']}"
        mix = " ".join(f"{g} {w:g}" for g, w in r["mixture"])
        rows.append(
            f"| {n} | {r['role']} | {r['profile']} | {info['params']:,} | {arch} | {mix} | "
            f"{' '.join(r.get('styles', ['fine']))} | {r['steps']} x {r['batch_size']} | "
            f"{info.get('precision', '?')} | {info['train_s']:.0f} | {_scores(info['accuracy'])} |"
        )
    flags = infos[models[0]].get("precision_choice", {})
    truth = SHIPPED / TRUTH
    card = MODEL_CARD.format(rows="\n".join(rows), choice=json.dumps(flags, sort_keys=True))
    return card + ("\n" + truth.read_text() if truth.is_file() else "")


MODEL_CARD = """# The shipped sandbox zoo

Tiny Llama-architecture causal LMs with a character-level tokenizer and a chat template, pretrained
from scratch by `cotgap sandbox build` (harness/sandbox/zoo.py) on the sandbox tasks' train items
(harness/sandbox/tasks.py; test questions are kept out by the tasks' split rule). They exist so that
the demo and the test suite run the real pipeline offline, with the same numbers on every CPU: a
rebuild depends on the CPU's precision path and kernels, these files do not. License: Apache-2.0,
as cotgap. No data outside this repository went into them.

How they were built: AdamW (betas 0.9/0.95, weight decay 0.01 on matrices), warmup then cosine
decay to 10% of the recipe's learning rate, loss on the assistant tokens only, 2 threads; bf16
autocast where the CPU has native bf16, else fp32 (column "precision"). Build machine: {choice}.
Mixture: each task's share of the pretraining items; styles: the ways of writing a rationale the
model learnt (harness/sandbox/tasks.py STYLES; a task's share is split evenly among its styles),
so teachers of one style write traces of that form. Accuracy: greedy, on the first 100 test items
(seed 1234) of each task in the mixture, in whatever style the model chooses.

| model | role | profile | params | architecture | mixture | styles | steps x batch | precision | train s | accuracy |
|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Every file is listed with its sha256 in SHA256SUMS and checked when the model is first used.
Rebuild and compare: `cotgap sandbox build --check` (demo profile) or `--profile test --check`.
Replace them (maintainers): `cotgap sandbox build --ship`, then commit this folder.
"""
