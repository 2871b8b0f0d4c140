"""Where a teacher or student lives, and what identifies its weights in a cell key.

    python -c "from harness.models import resolve; ..."

A model entry's `path` is a local directory, a hub id (`Qwen/Qwen2.5-0.5B-Instruct`), or
`sandbox:<name>` for the tiny zoo that `cotgap sandbox build` pretrains here.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

from harness.config import ModelSpec
from harness.errors import UserError

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


def identity(spec: ModelSpec) -> dict[str, Any]:
    """What changes a model's outputs: its weights and how it is prompted and run (not its name)."""
    if spec.path.startswith(SANDBOX_PREFIX):
        from harness.sandbox import zoo

        name = spec.path.removeprefix(SANDBOX_PREFIX)
        if name not in zoo.ZOO:
            raise UserError(
                f"model {spec.name!r}: unknown sandbox model {name!r}; fix the path in the config "
                f"(valid: {', '.join(sorted(zoo.ZOO))})."
            )
        source: dict[str, Any] = {"sandbox": zoo.model_id(name)}
    elif Path(spec.path).expanduser().is_dir():
        d = Path(spec.path).expanduser().resolve()
        source = {"local": str(d), "fingerprint": _weights_fingerprint(d)}
    elif spec.path.startswith((".", "/", "~")):
        raise UserError(
            f"model {spec.name!r}: path {spec.path!r} is not an existing directory; fix the path "
            "in the config, or give a hub id (org/name) or sandbox:<zoo model>."
        )
    else:
        source = {"hub": spec.path, "revision": spec.revision or "main"}
    return {
        **source,
        "chat_template": spec.chat_template,
        "trust_remote_code": spec.trust_remote_code,
        "dtype": spec.engine.dtype,
        "quantization": spec.engine.quantization,
        "max_model_len": spec.engine.max_model_len,
    }


def resolve(spec: ModelSpec) -> str:
    """A local directory holding the model, downloading it from the hub when online."""
    if spec.path.startswith(SANDBOX_PREFIX):
        from harness.sandbox import zoo

        name = spec.path.removeprefix(SANDBOX_PREFIX)
        if name not in zoo.ZOO:
            raise UserError(
                f"model {spec.name!r}: unknown sandbox model {name!r}; valid: {', '.join(sorted(zoo.ZOO))}."
            )
        if not zoo.is_built(name):
            raise UserError(
                f"model {spec.name!r}: sandbox model {name!r} is not built yet; run `cotgap sandbox build`."
            )
        return str(zoo.model_dir(name))
    local = Path(spec.path).expanduser()
    if local.is_dir():
        if not (local / "config.json").exists():
            raise UserError(
                f"model {spec.name!r}: {local} has no config.json; point path at a Hugging Face model directory."
            )
        return str(local.resolve())
    if spec.path.startswith((".", "/", "~")) or spec.path.count("/") != 1:
        raise UserError(
            f"model {spec.name!r}: path {spec.path!r} is neither an existing directory nor a hub id "
            "(org/name); fix the path in the config."
        )
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


def param_count(spec: ModelSpec) -> int | None:
    """Parameters in the model's safetensors files, read from their headers (no weights loaded).

    None when the model is not on this machine (a hub id missing from the local cache: nothing is
    downloaded for this) or has no safetensors files.
    """
    from safetensors import safe_open

    try:
        if spec.path.startswith(SANDBOX_PREFIX) or Path(spec.path).expanduser().is_dir():
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
