"""`specdec preflight` and the GPU memory plan: the checks are pure functions of facts, so the facts of
nodes this machine is not (an H200 ready for class, a wrong torch pin, transformers 5.17) are handed in.
"""

import contextlib
import itertools
import json
import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from specdec.serving.ops import gpu
from specdec.serving.ops.gpu import GIB, MIB, Gpu, MemoryPlanError, ServerNeeds, memory_plan
from specdec.serving.ops.preflight import Facts, ModelFacts, choose_mode, exit_status, inspect_model, pinned, run_checks
from specdec.zoo import zoo_parts

TINY = zoo_parts("tiny")
H200 = Gpu(0, "NVIDIA H200", 143771 * MIB, 142000 * MIB, "GPU-1234")
SGLANG_0516 = ("torch==2.11.0", "transformers==5.12.1", "fastapi", 'pytest; extra == "test"')


def model(spec="tiny", path=None) -> ModelFacts:
    return inspect_model(spec, path or TINY["target"])


def ready_gpu_node(**changes) -> Facts:
    """The air-gapped H200 of shared/sglang-offline/README.md, with the offline pack set up."""
    facts = Facts(gpu_device=True, gpus=(H200,), driver="580.82", driver_cuda="13.0", torch="2.11.0+cu130",
                  torch_cuda="13.0", cuda_available=True, sglang="0.5.16", sglang_requires=SGLANG_0516,
                  transformers="5.12.1", fa3=False, deep_gemm=True, models=(model(),), students=4,
                  busy_ports=(), disk_free_gib=(("/tmp", 40.0),))
    return replace(facts, **changes)


def laptop(**changes) -> Facts:
    facts = Facts(torch="2.13.0+cpu", transformers="5.17.0", models=(model(),), students=4, disk_free_gib=(("/tmp", 40.0),))
    return replace(facts, **changes)


def by_name(checks):
    return {c.name: c for c in checks}


def test_a_ready_gpu_node_passes_and_says_what_it_found():
    facts = ready_gpu_node()
    assert choose_mode("auto", facts)[0] == "gpu"
    checks = run_checks(facts, "gpu")
    assert exit_status(checks) == 0, [c for c in checks if not c.ok and c.required]
    c = by_name(checks)
    assert "NVIDIA H200" in c["GPU"].detail and c["torch pin"].ok and "2.11.0" in c["torch pin"].detail
    assert not c["FA3 kernels"].ok and not c["FA3 kernels"].required and "triton" in c["FA3 kernels"].fix
    assert "4 server(s)" in c["GPU memory"].detail


def test_no_gpu_fails_the_gpu_path_and_passes_the_cpu_one():
    facts = laptop()
    mode, why = choose_mode("auto", facts)
    assert mode == "cpu" and "no GPU" in why
    assert exit_status(run_checks(facts, "cpu")) == 0
    checks = run_checks(facts, "gpu")
    c = by_name(checks)
    assert exit_status(checks) == 1
    assert c["GPU"].status == "FAIL" and "no NVIDIA GPU" in c["GPU"].detail and "--engine specdec" in c["GPU"].fix
    assert c["CUDA"].status == "FAIL" and "CPU build" in c["CUDA"].detail
    assert c["sglang"].status == "FAIL" and "SGLang 0.5.18..0.5.20 pins torch 2.13.0" in c["sglang"].fix
    # the cpu path reports the same facts as warnings, not failures
    assert {x.status for x in run_checks(facts, "cpu") if x.name in ("GPU", "CUDA", "sglang")} == {"warn"}


def test_a_wrong_torch_pin_fails_with_the_versions_that_fit():
    checks = run_checks(ready_gpu_node(torch="2.13.0+cu130"), "gpu")
    c = by_name(checks)["torch pin"]
    assert c.status == "FAIL" and "pins torch 2.11.0, torch 2.13.0+cu130 is installed" in c.detail
    assert "torch==2.11.0" in c.fix and "SGLang 0.5.18..0.5.20 pins torch 2.13.0" in c.fix
    assert exit_status(checks) == 1


def test_the_installed_metadata_pin_wins_over_the_table():
    facts = ready_gpu_node(sglang_requires=("torch==2.11.1", "transformers==5.12.1"), torch="2.11.1")
    assert by_name(run_checks(facts, "gpu"))["torch pin"].ok
    assert pinned(("Torch == 2.9.1 ; python_version >= '3.10'",), "torch") == "2.9.1"
    assert pinned(("torchvision==0.1",), "torch") is None


def test_transformers_5_17_fails_sglang_0_5_16_with_its_pin_as_the_fix():
    err = "ValueError: 'qwen3_asr' is already used by a Transformers config, pick another name."
    checks = by_name(run_checks(ready_gpu_node(transformers="5.17.0", sglang_import_error=err), "gpu"))
    assert checks["sglang"].status == "FAIL" and "qwen3_asr" in checks["sglang"].detail
    assert "transformers==5.12.1" in checks["sglang"].fix and "tf5121.tar.xz" in checks["sglang"].fix
    assert checks["transformers"].status == "FAIL" and "5.12.1" in checks["transformers"].detail
    # without metadata (an old pack), the table knows 0.5.16's pin
    assert "5.12.1" in by_name(run_checks(ready_gpu_node(transformers="5.17.0", sglang_requires=()), "gpu"))[
        "transformers"].detail


def test_a_missing_module_names_what_to_install():
    checks = by_name(run_checks(ready_gpu_node(sglang_import_error="ModuleNotFoundError: No module named 'orjson'"), "gpu"))
    assert checks["sglang"].status == "FAIL" and checks["sglang"].fix.startswith("install orjson")


def test_driver_older_than_torchs_cuda():
    c = by_name(run_checks(ready_gpu_node(driver_cuda="12.4", cuda_available=False), "gpu"))["CUDA"]
    assert c.status == "FAIL" and "supports only 12.4" in c.detail and "update the NVIDIA driver" in c.fix


def test_models_missing_config_only_and_without_tokenizer(tmp_path):
    missing = inspect_model("/models/llama", tmp_path / "llama")
    assert "no such directory" in missing.problem and "cannot download" in missing.fix
    (tmp_path / "noconfig").mkdir()
    assert "no config.json" in inspect_model("x", tmp_path / "noconfig").problem
    dummy = tmp_path / "dummy-8b"
    dummy.mkdir()
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (dummy / "config.json").write_text(json.dumps(cfg))
    assert "no tokenizer" in inspect_model("d", dummy).problem
    (dummy / "tokenizer.json").write_text("{}")
    facts = inspect_model("d", dummy)
    assert facts.problem is None and not facts.weights
    # an 8B shape: about 7.5e9 parameters in bf16, estimated from config.json alone
    assert 13 * GIB < facts.needs.weights_bytes < 15 * GIB
    gpu_checks = by_name(run_checks(ready_gpu_node(models=(facts, missing)), "gpu"))
    assert gpu_checks["model d"].ok and "--load-format dummy" in gpu_checks["model d"].detail
    assert gpu_checks["model /models/llama"].status == "FAIL"
    cpu_checks = by_name(run_checks(laptop(models=(facts,)), "cpu"))
    assert cpu_checks["model d"].status == "FAIL" and "needs weights" in cpu_checks["model d"].fix


def test_busy_ports_fail_when_too_few_are_left():
    facts = ready_gpu_node(port_range=(30000, 30004), busy_ports=(30000, 30001, 30003), students=4)
    c = by_name(run_checks(facts, "gpu"))["ports"]
    assert c.status == "FAIL" and "2 free in 30000-30004 for 4 students" in c.detail and "30000, 30001, 30003" in c.detail
    assert by_name(run_checks(replace(facts, students=2), "gpu"))["ports"].ok


def test_too_many_students_for_the_gpu_and_too_little_disk():
    big = ModelFacts("big", "/m", True, True, True, ServerNeeds(40 * GIB, 128 * 1024))
    checks = by_name(run_checks(ready_gpu_node(models=(big,), disk_free_gib=(("/tmp", 0.5),)), "gpu"))
    assert checks["GPU memory"].status == "FAIL" and "2 fit" in checks["GPU memory"].detail
    assert checks["disk"].status == "FAIL" and "/tmp" in checks["disk"].fix
    two_gpus = ready_gpu_node(models=(big,), gpus=(H200, replace(H200, index=1, uuid="GPU-5678")))
    assert by_name(run_checks(two_gpus, "gpu"))["GPU memory"].ok  # two students on each


# ----- facts read from text and files ------------------------------------------------------------------
def test_nvidia_smi_output_and_cuda_visible_devices():
    text = ("0, GPU-aaa, NVIDIA H200, 143771, 142000\n1, GPU-bbb, NVIDIA H200, 143771, [N/A]\n"
            "2, GPU-ccc, NVIDIA H200, 143771, 1000\n")
    gpus = gpu.parse_gpu_query(text)
    assert [g.index for g in gpus] == [0, 2] and gpus[0].free_bytes == 142000 * MIB
    assert [g.index for g in gpu.visible(gpus, "2")] == [2]
    assert [g.index for g in gpu.visible(gpus, "GPU-ccc,0")] == [2, 0]
    assert gpu.visible(gpus, "") == [] and len(gpu.visible(gpus, None)) == 2
    assert gpu.parse_driver("| NVIDIA-SMI 580.82   Driver Version: 580.82.07   CUDA Version: 13.0 |") == ("580.82.07", "13.0")


def test_kv_bytes_of_the_tiny_zoo_per_algorithm():
    config = gpu.read_config(TINY["target"])
    per_layer = 2 * config["num_key_value_heads"] * config["head_dim"] * 2  # K and V, bf16
    plain = gpu.server_needs(TINY["target"])
    assert plain.kv_bytes_per_token == per_layer * config["num_hidden_layers"]
    assert plain.weights_bytes == (TINY["target"] / "model.safetensors").stat().st_size
    assert gpu.server_needs(TINY["target"], "NEXTN").kv_bytes_per_token == plain.kv_bytes_per_token + per_layer
    eagle = gpu.server_needs(TINY["target"], "EAGLE", TINY["eagle"])
    assert eagle.weights_bytes > plain.weights_bytes and eagle.kv_bytes_per_token > plain.kv_bytes_per_token
    assert gpu.server_needs(TINY["target"], "NGRAM") == plain


# ----- the memory plan holds in every start order ------------------------------------------------------
def sglang_start(order, free, needs, fraction, cap_tokens):
    """SGLang 0.5.16's sizing replayed for servers starting in `order` (events ('note', i) and ('size', i)):
    each notes T = free at start, then after its weights keeps free - T * (1 - fraction) for its KV cache,
    capped at cap_tokens, and fails at <= 0. Returns each server's KV tokens (None: it failed)."""
    noted, tokens = {}, {}
    for event, i in order:
        if event == "note":
            noted[i] = free
        else:
            free -= needs.weights_bytes
            rest = free - noted[i] * (1 - fraction)
            profiled = int(rest // needs.kv_bytes_per_token)
            if profiled <= 0:
                tokens[i] = None
                continue
            tokens[i] = min(cap_tokens, profiled) if cap_tokens else profiled
            free -= tokens[i] * needs.kv_bytes_per_token
    assert free >= 0
    return tokens


def start_orders(n):
    """Every order of n servers' events in which each notes its memory before sizing its cache."""
    events = [("note", i) for i in range(n)] + [("size", i) for i in range(n)]
    for order in set(itertools.permutations(events)):
        if all(order.index(("note", i)) < order.index(("size", i)) for i in range(n)):
            yield order


def test_the_plan_survives_every_start_order_where_a_plain_fraction_fails():
    free, needs = 140 * GIB, ServerNeeds(2 * GIB, 128 * 1024)  # an 8B-like KV cost per token
    plan = memory_plan(free, 3, needs, headroom=0.2)
    assert plan.mem_fraction_static == 0.8 and plan.share_bytes == int(free * 0.8 / 3)
    for order in start_orders(3):
        got = sglang_start(order, free, needs, plan.mem_fraction_static, plan.max_total_tokens)
        assert all(t is not None and t >= 0.999 * plan.max_total_tokens for t in got.values()), (order, got)
    # the fraction divided among the servers, as one might try, fails when starts overlap
    outcomes = [sglang_start(o, free, needs, 0.8 / 3, None) for o in start_orders(3)]
    assert any(None in t.values() for t in outcomes) and any(None not in t.values() for t in outcomes)


def test_a_plan_that_does_not_fit_says_how_many_do():
    with pytest.raises(MemoryPlanError, match=r"4 server\(s\) do not fit .* 2 fit"):
        memory_plan(140 * GIB, 4, ServerNeeds(40 * GIB, 128 * 1024))
    with pytest.raises(MemoryPlanError, match="headroom"):
        memory_plan(140 * GIB, 4, ServerNeeds(0, 1), headroom=1.0)


# ----- the command --------------------------------------------------------------------------------------
def run(*args):
    return subprocess.run([sys.executable, "-m", "specdec", "preflight", *args], capture_output=True, text=True, check=False,
                          timeout=300)


def is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_cpu_path_is_ready_here_and_a_busy_port_or_a_missing_model_is_not():
    with contextlib.ExitStack() as held:
        # a port we hold next to one that is free; other processes' connections take ports in the same range
        # (one took the neighbour during a CI run), so a neighbour found busy means: try another pair
        r = None
        for _ in range(10):
            busy = held.enter_context(socket.socket())
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            if port < 65535 and is_free(port + 1):
                r = run("--mode", "cpu", "--port-range", f"{port}-{port + 1}", "--students", "1")
                if f"busy: {port}, {port + 1}" not in r.stdout:
                    break
        assert r is not None, "no free port next to a bound one in 10 tries"
        assert r.returncode == 0 and "ready for the cpu path" in r.stdout, r.stdout + r.stderr
        assert f"busy: {port}" in r.stdout and "specdec serve" in r.stdout
        r = run("--mode", "cpu", "--port-range", f"{port}-{port}", "--models", "tiny", "/no/such/model")
        assert r.returncode == 1
        lines = r.stdout.splitlines()
        assert any(ln.split()[:2] == ["FAIL", "ports"] for ln in lines)
        assert any(ln.split()[:3] == ["FAIL", "model", "/no/such/model"] for ln in lines)
        assert "not ready for the cpu path: 2 check(s) failed" in r.stdout


def test_bad_arguments_are_one_line():
    r = run("--port-range", "9-3")
    assert r.returncode == 2
    assert r.stderr.strip() == "specdec preflight: error: --port-range takes A-B with 1 <= A <= B <= 65535, got '9-3'"
