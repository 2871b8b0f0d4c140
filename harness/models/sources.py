"""Where a teacher or student lives, and what identifies its weights in a cell key.

    python -c "from harness.models.sources import resolve; ..."

A model entry's `path` is a local directory, a hub id (`Qwen/Qwen2.5-0.5B-Instruct`),
`sandbox:<name>` for the tiny zoo that `cotgap sandbox build` pretrains here, or `gguf:<file or
installed package>` for a quantised GGUF file, de-quantised once (harness/models/gguf.py). Each kind of
path is one row of SOURCES: how to recognise it, what identifies it, where its directory is.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from harness.config.schema import ModelSpec
from harness.errors import UserError
from harness.models import gguf

SANDBOX_PREFIX = "sandbox:"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _weights_fingerprint(d: Path) -> str:
    """Hash of config.json plus the names and sizes of weight files: cheap even for 70B checkpoints."""
    h = hashlib.sha256()
    cfg = d / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    for p in sorted(d.iterdir()):
        if p.suffix in (".safetensors", ".bin", ".json") and p.is_file():
            h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()[:16]


def _zoo_name(spec: ModelSpec) -> str:
    from harness.sandbox import zoo

    name = spec_path(spec).removeprefix(SANDBOX_PREFIX)
    if name not in zoo.ZOO:
        raise UserError(
            f"model {spec.name!r}: unknown sandbox model {name!r}; fix the path in the config "
            f"(valid: {', '.join(sorted(zoo.ZOO))})."
        )
    return name


def _sandbox_id(spec: ModelSpec) -> dict[str, Any]:
    from harness.sandbox import zoo

    return {"sandbox": zoo.model_id(_zoo_name(spec))}


def _sandbox_dir(spec: ModelSpec) -> str:
    from harness.sandbox import zoo

    if not zoo.is_built(name := _zoo_name(spec)):
        raise UserError(
            f"model {spec.name!r}: sandbox model {name!r} is not built yet; run `cotgap sandbox build`."
        )
    return str(zoo.model_dir(name))


def _gguf_ref(spec: ModelSpec) -> tuple[str, str]:
    return spec_path(spec).removeprefix(gguf.PREFIX), f"model {spec.name!r}"


def _local_id(spec: ModelSpec) -> dict[str, Any]:
    d = Path(spec_path(spec)).expanduser().resolve()
    return {"local": str(d), "fingerprint": _weights_fingerprint(d)}


def _local_dir(spec: ModelSpec) -> str:
    d = Path(spec_path(spec)).expanduser().resolve()
    if not (d / "config.json").exists():
        raise UserError(
            f"model {spec.name!r}: {d} has no config.json; point path at a Hugging Face model directory."
        )
    return str(d)


def _missing(spec: ModelSpec) -> Any:
    path = Path(spec_path(spec)).expanduser()
    near = []
    if path.parent.is_dir():  # a typo of a folder that is there
        folders = [d.name for d in path.parent.iterdir() if d.is_dir()]
        near = difflib.get_close_matches(path.name, folders, n=1, cutoff=0.6)
    hint = f" (did you mean {str(path.parent / near[0])!r}?)" if near else ""
    raise UserError(
        f"model {spec.name!r}: path {spec.path!r} is not an existing directory (a relative path, "
        "and org/name where a folder `org` is there, is taken relative to the config file's "
        f"folder, on the command line to the working directory); fix the path in the config{hint}, "
        "or give a hub id (org/name), sandbox:<zoo model> or gguf:<file>."
    )


# the hub's repository ids: org/name, each part letters, digits, '-', '_', '.' (no '--' or '..',
# no leading or trailing '-' or '.'), at most 96 characters each
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_PART}/{_PART}$")


def _hub_id(spec: ModelSpec) -> dict[str, Any]:
    path = spec_path(spec)
    if not _REPO_ID.match(path) or "--" in path or ".." in path or path.endswith(".git"):
        raise UserError(
            f"model {spec.name!r}: path {path!r} is neither an existing directory nor a hub id "
            "(org/name: letters, digits, '-', '_' and '.'); fix the path in the config."
        )
    return {"hub": path, "revision": spec.revision or "main"}


def _hub_dir(spec: ModelSpec) -> str:
    _hub_id(spec)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(spec.path, revision=spec.revision, local_files_only=_offline())
    except Exception as e:  # huggingface_hub raises several unrelated types for "not available"
        if _offline():
            raise UserError(
                f"model {spec.name!r}: {spec.path!r} is a hub id, but this machine is offline "
                "(HF_HUB_OFFLINE=1) and it is not in the local cache; download it elsewhere and set "
                "path to the local directory."
            ) from None
        raise UserError(
            f"model {spec.name!r}: could not fetch {spec.path!r} from the hub: {e}"
        ) from None


def _served_id(spec: ModelSpec) -> dict[str, Any]:
    """A served model is its server's model name and how it is asked; with a local `path` (its
    tokenizer, for endpoint completions) what identifies that path as well. The server's address
    is not part of it: the same model served elsewhere gives the same outputs."""
    ident: dict[str, Any] = {"served": spec.engine.model, "endpoint": spec.engine.endpoint}
    if spec.path:
        ident["tokenizer"] = _local_source(spec).identity(spec)
    return ident


def _served_dir(spec: ModelSpec) -> str:
    if not spec.path:
        raise UserError(
            f"model {spec.name!r} is served (engine.kind: openai) and has no local files; give "
            "its `path` where a local copy of its tokenizer is needed."
        )
    return _local_source(spec).resolve(spec)


def _local_source(spec: ModelSpec) -> ModelSource:
    """Where a served model's `path` points (its tokenizer): the source it would have unserved."""
    return next(src for name, src in SOURCES.items() if name != "served" and src.matches(spec))


class ModelSource(NamedTuple):
    matches: Callable[[ModelSpec], bool]
    identity: Callable[[ModelSpec], dict[str, Any]]  # what names the weights in cell keys
    resolve: Callable[[ModelSpec], str]  # the local directory, converted or downloaded first
    on_machine: bool  # resolve never downloads (param_count may call it)


# The first that matches wins.
SOURCES: dict[str, ModelSource] = {
    "served": ModelSource(lambda s: s.served, _served_id, _served_dir, True),
    "sandbox": ModelSource(
        lambda s: spec_path(s).startswith(SANDBOX_PREFIX), _sandbox_id, _sandbox_dir, True
    ),
    "gguf": ModelSource(
        lambda s: spec_path(s).startswith(gguf.PREFIX),
        lambda s: {"gguf": gguf.provenance(*_gguf_ref(s))},
        lambda s: str(gguf.convert(*_gguf_ref(s))),
        True,
    ),
    "local": ModelSource(
        lambda s: Path(spec_path(s)).expanduser().is_dir(), _local_id, _local_dir, True
    ),
    "missing": ModelSource(
        lambda s: spec_path(s).startswith((".", "/", "~")), _missing, _missing, True
    ),
    "hub": ModelSource(lambda s: True, _hub_id, _hub_dir, False),
}


def source(spec: ModelSpec) -> ModelSource:
    return next(src for src in SOURCES.values() if src.matches(spec))


def spec_path(spec: ModelSpec) -> str:
    """The model's `path`. Only a served model may have none, and a served model reaches no source
    but `served` (SOURCES tries it first; `_local_source` is asked only when the path is given)."""
    assert spec.path is not None, f"model {spec.name!r} has no path"
    return spec.path


def identity(spec: ModelSpec) -> dict[str, Any]:
    """What changes a model's outputs: its weights and how it is prompted and run (not its name)."""
    if spec.served:
        return {**_served_id(spec), "chat_template": spec.chat_template}
    return {
        **source(spec).identity(spec),
        "chat_template": spec.chat_template,
        "trust_remote_code": spec.trust_remote_code,
        "dtype": spec.engine.dtype,
        "quantization": spec.engine.quantization,
        "max_model_len": spec.engine.max_model_len,
    }


def resolve(spec: ModelSpec) -> str:
    """A local directory holding the model: converted from GGUF or downloaded on first use."""
    return source(spec).resolve(spec)


def directory_here(spec: ModelSpec) -> Path | None:
    """The model's directory when it is on this machine already (a built zoo model, a local
    folder, a converted GGUF file); None otherwise. Nothing is converted or downloaded."""
    if spec.served or not spec.path:
        return None
    try:
        if spec.path.startswith(SANDBOX_PREFIX):
            return Path(_sandbox_dir(spec))
        if spec.path.startswith(gguf.PREFIX):
            d = gguf.converted_dir(gguf.provenance(*_gguf_ref(spec)))
            return d if (d / "gguf.json").is_file() else None
        d = Path(spec.path).expanduser()
        return d if (d / "config.json").is_file() else None
    except UserError:
        return None


def param_count(spec: ModelSpec) -> int | None:
    """Parameters in the model's safetensors files, read from their headers (no weights loaded).

    None when the model is not on this machine (a hub id missing from the local cache: nothing is
    downloaded for this) or has no safetensors files.
    """
    from safetensors import safe_open

    try:
        if source(spec).on_machine:
            d = Path(resolve(spec))
        else:
            from huggingface_hub import snapshot_download

            d = Path(snapshot_download(spec.path, revision=spec.revision, local_files_only=True))
    except Exception:  # not available locally, for whatever reason: the size stays unknown
        return None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(f, framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += math.prod(st.get_slice(name).get_shape())
    return total


SMALL_MODEL = 20_000_000  # parameters: below this a CPU step is mostly per-op Python overhead


def all_small(specs: Iterable[ModelSpec]) -> bool:
    """Whether every model has fewer than SMALL_MODEL parameters (one served, or of a size not
    known here, is not small): on a CPU such models train and generate one core each
    (harness/stages/train.py, harness/devices.py: core_slots)."""
    for spec in specs:
        if spec.served:
            return False
        # a GGUF file is counted after its conversion, which this does not start: not known yet
        unknown = spec_path(spec).startswith(gguf.PREFIX)
        n = spec.size if spec.size is not None else None if unknown else param_count(spec)
        if n is None or n >= SMALL_MODEL:
            return False
    return True
