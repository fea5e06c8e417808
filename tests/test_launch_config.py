"""Launch configurations: SGLang's rules are enforced before anything starts, with one-line errors, and
the command line is spelled for the SGLang version (or for `specdec serve`)."""

import json
import sys

import pytest

from specdec.serving.ops.gpu import GIB
from specdec.serving.ops.launch import LaunchConfig, LaunchConfigError, parse_version

EAGLE = dict(algorithm="EAGLE", draft="/m/eagle", num_steps=3, topk=1, num_draft_tokens=4)


def flags(cmd: list[str]) -> dict[str, str | None]:
    """--flag value pairs (value None for a switch)."""
    out, i = {}, 0
    while i < len(cmd):
        if cmd[i].startswith("--"):
            has_value = i + 1 < len(cmd) and not cmd[i + 1].startswith("--")
            out[cmd[i]] = cmd[i + 1] if has_value else None
            i += 2 if has_value else 1
        else:
            i += 1
    return out


@pytest.mark.parametrize("kwargs, message", [
    (dict(algorithm="EAGLE", draft="d", num_steps=3, topk=1, num_draft_tokens=5),
     r"topk 1 forces num_draft_tokens = num_steps \+ 1 = 4, got 5"),
    (dict(algorithm="EAGLE", draft="d", num_steps=3), "set together or not at all"),
    (dict(algorithm="EAGLE", draft="d", topk=1, num_draft_tokens=4), "set together or not at all"),
    (dict(algorithm="EAGLE", draft="d", num_steps=2, topk=4, num_draft_tokens=10), r"\[2, 9\]"),
    (dict(algorithm="EAGLE", draft="d", num_steps=0, topk=1, num_draft_tokens=1), "must be >= 1"),
    (dict(algorithm="EAGLE"), "EAGLE needs a draft model"),
    (dict(algorithm="EAGLE3"), "EAGLE3 needs a draft model"),
    (dict(algorithm="STANDALONE"), "STANDALONE needs a draft model"),
    (dict(algorithm="NEXTN", draft="d"), "NEXTN uses the target's own MTP layers"),
    (dict(algorithm="NGRAM", draft="d"), "NGRAM takes no draft model"),
    (dict(algorithm="NGRAM", num_steps=3, topk=1, num_draft_tokens=4), "NGRAM sets its own num_steps and topk"),
    (dict(algorithm="none", num_steps=3, topk=1, num_draft_tokens=4), "takes no speculative settings"),
    (dict(algorithm="none", draft="d"), "takes no speculative settings, got draft"),
    (dict(algorithm="medusa"), "unknown speculative algorithm 'medusa'"),
    (dict(algorithm="EAGLE", draft="d", ngram_max_depth=4), "ngram_max_depth is NGRAM's"),
    (dict(algorithm="STANDALONE", draft="d", rejection_sampling=True), "EAGLE, EAGLE3 and NEXTN only"),
    (dict(algorithm="EAGLE", draft="d", num_steps=2, topk=2, num_draft_tokens=4, rejection_sampling=True), "needs topk 1"),
    (dict(**EAGLE, attention_backend="flashmla"), "cannot verify drafts"),
    (dict(algorithm="EAGLE", draft="d", num_steps=2, topk=2, num_draft_tokens=4, attention_backend="trtllm_mha"), "chains only"),
    (dict(nnodes=2), "need dist_init_addr"),
    (dict(nnodes=2, node_rank=2, dist_init_addr="h:5000"), r"node_rank must be in \[0, nnodes\)"),
    (dict(tp=0), "tp must be >= 1"),
    (dict(port=70000), "port must be in 1..65535"),
    (dict(mem_fraction_static=1.5), r"mem_fraction_static must be in \(0, 1\)"),
    (dict(api_key="two words"), "without spaces"),
    (dict(backend="vllm"), "backend must be one of"),
    (dict(algorithm="EAGLE", draft="d", num_steps=3.0, topk=1, num_draft_tokens=4), "num_steps must be an integer"),
])
def test_invalid_configs_fail_before_anything_starts_with_one_line(kwargs, message):
    with pytest.raises(LaunchConfigError, match=message) as err:
        LaunchConfig("/m/target", **kwargs)
    assert "\n" not in str(err.value)


def test_valid_configs_of_every_algorithm():
    ok = [LaunchConfig("/m"), LaunchConfig("/m", **EAGLE), LaunchConfig("/m", "NEXTN"),
          LaunchConfig("/m", "NEXTN", num_steps=3, topk=1, num_draft_tokens=4),
          LaunchConfig("/m", "EAGLE3", draft="d", num_steps=5, topk=8, num_draft_tokens=32),
          LaunchConfig("/m", "STANDALONE", draft="d", num_steps=4, topk=1, num_draft_tokens=5),
          LaunchConfig("/m", "NGRAM"), LaunchConfig("/m", "NGRAM", num_draft_tokens=8, ngram_max_depth=6),
          LaunchConfig("/m", "heads", num_steps=3, topk=1, num_draft_tokens=4)]
    assert [c.algorithm for c in ok] == ["none", "EAGLE", "NEXTN", "NEXTN", "EAGLE3", "STANDALONE", "NGRAM", "NGRAM", "HEADS"]
    assert LaunchConfig("/m", "mtp").algorithm == "NEXTN" and LaunchConfig("/m", "draft", draft="d").algorithm == "STANDALONE"


def test_sglang_command_of_the_offline_node_matches_what_ran_there():
    """shared/sglang-offline/README.md: the flags that worked on 0.5.16 for EAGLE."""
    cfg = LaunchConfig("/m/target", **EAGLE, port=30000, attention_backend="triton", cuda_graph_max_bs=16,
                       mem_fraction_static=0.3)
    cmd = cfg.sglang_command("0.5.16", python="python3")
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flags(cmd) == {"--model-path": "/m/target", "--host": "127.0.0.1", "--port": "30000",
                          "--speculative-algorithm": "EAGLE", "--speculative-draft-model-path": "/m/eagle",
                          "--speculative-num-steps": "3", "--speculative-eagle-topk": "1",
                          "--speculative-num-draft-tokens": "4", "--attention-backend": "triton",
                          "--cuda-graph-max-bs-decode": "16", "--mem-fraction-static": "0.3", "--enable-metrics": None}


@pytest.mark.parametrize("version, graph_flag", [("0.5.10", "--cuda-graph-max-bs"), ("0.5.14", "--cuda-graph-max-bs"),
                                                 ("0.5.16", "--cuda-graph-max-bs-decode"),
                                                 ("0.5.23", "--cuda-graph-max-bs-decode")])
def test_cuda_graph_flag_by_version(version, graph_flag):
    f = flags(LaunchConfig("/m", cuda_graph_max_bs=8).sglang_command(version))
    assert f[graph_flag] == "8" and len([k for k in f if k.startswith("--cuda-graph")]) == 1


@pytest.mark.parametrize("version, flag", [("0.5.5", "--speculative-ngram-max-match-window-size"),
                                           ("0.5.10", "--speculative-ngram-max-trie-depth"),
                                           ("0.5.23", "--speculative-ngram-max-trie-depth")])
def test_ngram_flags_by_version(version, flag):
    f = flags(LaunchConfig("/m", "NGRAM", num_draft_tokens=4, ngram_max_depth=6).sglang_command(version))
    assert f[flag] == "6" and f["--speculative-num-draft-tokens"] == "4" and "--speculative-eagle-topk" not in f


def test_multi_gpu_and_multi_node_flags():
    cfg = LaunchConfig("/m", tp=4, dp=2, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000", api_key="k",
                       enable_metrics=False, load_format="dummy", max_running_requests=64, disable_radix_cache=True)
    f = flags(cfg.sglang_command("0.5.16"))
    assert f["--tp-size"] == "4" and f["--dp-size"] == "2" and f["--nnodes"] == "2" and f["--node-rank"] == "1"
    assert f["--dist-init-addr"] == "10.0.0.1:5000" and f["--api-key"] == "k" and "--enable-metrics" not in f
    assert f["--load-format"] == "dummy" and f["--max-running-requests"] == "64" and "--disable-radix-cache" in f


def test_dummy_weights_apply_to_the_draft_too():
    f = flags(LaunchConfig("/m", **EAGLE, load_format="dummy").sglang_command("0.5.16"))
    assert f["--speculative-draft-load-format"] == "dummy"


def test_version_dependent_refusals():
    with pytest.raises(LaunchConfigError, match="0.5.14 or newer"):
        LaunchConfig("/m", **EAGLE, rejection_sampling=True).sglang_command("0.5.10")
    assert "--speculative-use-rejection-sampling" in LaunchConfig("/m", **EAGLE, rejection_sampling=True).sglang_command("0.5.14")
    with pytest.raises(LaunchConfigError, match="older than"):
        LaunchConfig("/m").sglang_command("0.4.9")
    with pytest.raises(LaunchConfigError, match="Medusa"):
        LaunchConfig("/m", "HEADS").sglang_command("0.5.16")
    with pytest.raises(LaunchConfigError, match="not an SGLang version"):
        parse_version("latest")
    assert parse_version("0.5.16.post1") == (0, 5, 16) and parse_version("v0.5.10rc0") == (0, 5, 10)


@pytest.mark.parametrize("algorithm, extra, name, k", [
    ("none", {}, "none", None), ("NEXTN", dict(num_steps=3, topk=1, num_draft_tokens=4), "mtp", "3"),
    ("EAGLE", dict(draft="d", num_steps=2, topk=1, num_draft_tokens=3), "eagle", "2"),
    ("STANDALONE", dict(draft="d", num_steps=4, topk=1, num_draft_tokens=5), "draft", "4"),
    ("NGRAM", dict(num_draft_tokens=6), "ngram", "5"), ("HEADS", dict(num_steps=3, topk=1, num_draft_tokens=4), "heads", "3"),
])
def test_the_same_config_renders_specdec_serve(algorithm, extra, name, k):
    cfg = LaunchConfig("tiny", algorithm, port=8123, api_key="k", max_running_requests=8, backend="specdec",
                       attention_backend=None, cuda_graph_max_bs=16, mem_fraction_static=0.3, **extra)
    cmd = cfg.command(python="python")
    assert cmd[:4] == ["python", "-m", "specdec", "serve"]
    f = flags(cmd)
    assert f["--model"] == "tiny" and f["--speculative-algorithm"] == name and f.get("--k") == k
    assert f.get("--speculative-draft-model-path") == extra.get("draft")  # the draft or EAGLE head to load
    assert f["--port"] == "8123" and f["--host"] == "127.0.0.1" and f["--api-key"] == "k" and f["--max-running-requests"] == "8"
    assert not any("cuda" in x or "mem-fraction" in x for x in f)  # GPU settings do not apply to specdec serve


def test_a_tree_renders_sglangs_three_numbers_for_specdec_serve():
    f = flags(LaunchConfig("tiny", "EAGLE", draft="d", num_steps=4, topk=4, num_draft_tokens=8).specdec_command("python"))
    assert (f["--k"], f["--topk"], f["--num-draft-tokens"]) == ("4", "4", "8")


def test_extra_args_reach_specdec_serve_last():
    cmd = LaunchConfig("tiny", "EAGLE", draft="d", backend="specdec", extra_args=("--compile", "on")).command("python")
    assert cmd[-2:] == ["--compile", "on"]


def test_specdec_serve_refusals():
    with pytest.raises(LaunchConfigError, match="no EAGLE3"):
        LaunchConfig("/m", "EAGLE3", draft="d").specdec_command()
    with pytest.raises(LaunchConfigError, match="EAGLE, NEXTN or HEADS only, not STANDALONE"):
        LaunchConfig("/m", "STANDALONE", draft="d", num_steps=2, topk=2, num_draft_tokens=4).specdec_command()
    with pytest.raises(LaunchConfigError, match="one engine on one device"):
        LaunchConfig("/m", tp=2).specdec_command()


def test_auto_backend_is_specdec_without_sglang_and_a_gpu(monkeypatch):
    import specdec.serving.ops.launch as launch

    monkeypatch.setattr(launch.importlib.util, "find_spec", lambda name: None)
    assert LaunchConfig("tiny").resolved_backend() == "specdec"
    assert LaunchConfig("tiny").command()[2:4] == ["specdec", "serve"]


# ----- the KV pool of a default SGLang command (issue 18)
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def model_dir(path, config: dict) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_an_8b_shaped_model_gets_a_pool_that_fits_one_gpu_beside_its_draft(tmp_path):
    target = model_dir(tmp_path / "8b", LLAMA_8B)
    head = model_dir(tmp_path / "8b-eagle", {**LLAMA_8B, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1})
    cfg = LaunchConfig(target, "EAGLE", draft=head, num_steps=3, topk=1, num_draft_tokens=4, backend="sglang",
                       load_format="dummy")
    pool = cfg.kv_pool_default()
    assert pool.tokens == 48 * 4096 and pool.context_from == "the course's default"  # not the model's 8192
    assert pool.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 + 2 * 1 * 8 * 128 * 2  # target's 32 layers + the head's one
    need = pool.weights_bytes + pool.tokens * pool.kv_bytes_per_token
    assert 16 * GIB < need < 0.7 * 80 * GIB  # an H100's 80 GB holds it, with SGLang's CUDA graphs and activations beside
    f = flags(cfg.sglang_command("0.5.16"))
    assert f["--max-total-tokens"] == "196608" and "--mem-fraction-static" not in f
    assert "KV pool: --max-total-tokens 196608 = 48 running requests x 4096 tokens" in pool.describe()
    assert "GiB beside" in pool.describe()
    plain = LaunchConfig(target, backend="sglang", max_running_requests=64).kv_pool_default()
    assert plain.tokens == 64 * 4096 and plain.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_the_kv_pool_default_never_overrides_the_users_sizing():
    def rendered(**kw) -> list[str]:
        return LaunchConfig("/no/such/dir", "NGRAM", backend="sglang", **kw).sglang_command("0.5.16")

    assert flags(rendered())["--max-total-tokens"] == str(48 * 4096)  # a hub id: the course's default context
    assert LaunchConfig("org/model").kv_pool_default().kv_bytes_per_token == 0  # no config.json at hand: no estimate
    assert "--max-total-tokens" not in rendered(mem_fraction_static=0.5)
    assert flags(rendered(max_total_tokens=5000))["--max-total-tokens"] == "5000"
    for extra in (("--mem-fraction-static", "0.5"), ("--mem-fraction-static=0.5",), ("--max-total-tokens", "7000"),
                  ("--max-total-tokens=7000",)):
        cmd = rendered(extra_args=extra)
        assert cmd[-len(extra):] == list(extra) and sum(a.startswith("--max-total-tokens") for a in cmd) <= 1, extra
        assert LaunchConfig("/m", extra_args=extra).kv_pool_default() is None
    f = flags(rendered(context_length=1024))
    assert f["--context-length"] == "1024" and f["--max-total-tokens"] == str(48 * 1024)
    assert flags(rendered(extra_args=("--context-length", "512")))["--max-total-tokens"] == str(48 * 512)
    assert flags(rendered(context_length=256, max_running_requests=8))["--max-total-tokens"] == "16384"  # one prefill


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_total_tokens=0), "max_total_tokens must be an integer >= 1"),
    (dict(context_length="4096"), "context_length must be an integer >= 1"),
])
def test_pool_settings_are_checked(kwargs, message):
    with pytest.raises(LaunchConfigError, match=message):
        LaunchConfig("/m", **kwargs)


def test_an_sglang_server_times_its_steps_and_ours_needs_nothing():
    """SGLang fills /server_info's step_time_dict only with SGLANG_RECORD_STEP_TIME=1 (Lab 3's step costs and the
    crossover read it; without it a class on real SGLang saw 'these servers sent no step times')."""
    assert LaunchConfig("m", backend="sglang").environment() == {"SGLANG_RECORD_STEP_TIME": "1"}
    assert LaunchConfig("tiny", backend="specdec").environment() == {}


def test_start_hands_the_config_environment_to_the_server(monkeypatch, tmp_path):
    """start() puts LaunchConfig.environment() in the server's environment; the caller's env= comes after it."""
    import time

    from specdec.serving.ops import lifecycle

    monkeypatch.setenv(lifecycle.RUN_DIR_ENV, str(tmp_path))
    shows = "import os, time; print(os.environ.get('SGLANG_RECORD_STEP_TIME'), os.environ.get('X'), flush=True); time.sleep(60)"
    monkeypatch.setattr(LaunchConfig, "command", lambda self, version=None, python=None: [sys.executable, "-c", shows])
    for env, seen in ((None, "1 None"), ({"SGLANG_RECORD_STEP_TIME": "0", "X": "y"}, "0 y")):
        server = lifecycle.start(LaunchConfig("m", backend="sglang"), env=env)
        try:
            deadline = time.monotonic() + 30
            while seen not in server.log_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert seen in server.log_path.read_text()
        finally:
            server.stop(grace=2)


def test_a_server_sized_by_a_fraction_of_free_memory_is_told_apart():
    """room.lab_servers starts such SGLang servers one after the other (LaunchConfig.sized_by_fraction)."""
    assert LaunchConfig("/m", backend="sglang", mem_fraction_static=0.3).sized_by_fraction()
    assert LaunchConfig("/m", backend="sglang", extra_args=("--mem-fraction-static=0.5",)).sized_by_fraction()
    assert LaunchConfig("/m", backend="sglang", extra_args=("--mem-fraction-static", "0.5")).sized_by_fraction()
    assert not LaunchConfig("/m", backend="sglang").sized_by_fraction()  # the course's default: a cap in tokens
    assert not LaunchConfig("/m", backend="sglang", max_total_tokens=65536).sized_by_fraction()
    assert not LaunchConfig("tiny", backend="specdec", mem_fraction_static=0.3).sized_by_fraction()
