"""`specdec launch`: zoo names become directories for SGLang, bad configurations are one line, and the
command waits for Ctrl-C and stops its server."""

import _thread
import contextlib
import io
import shlex
import threading
import time

import pytest
from test_launch_lifecycle import standin

import specdec.cli.launch as launch_cli
from specdec.cli import main as cli
from specdec.serving.ops.lifecycle import RUN_DIR_ENV, launch, pid_alive
from specdec.zoo import resolve

ZOO = resolve("tiny")


def dry_run_lines(*argv) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["launch", *argv, "--dry-run"]) == 0
    return out.getvalue().strip().splitlines()


def dry_run(*argv) -> list[str]:
    """The command line --dry-run prints (its last line; a comment may come before it)."""
    lines = dry_run_lines(*argv)
    assert all(ln.startswith("# ") for ln in lines[:-1])
    return shlex.split(lines[-1])


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_zoo_parts_become_sglang_directories():
    cmd = dry_run("--model", "tiny", "--speculative-algorithm", "EAGLE", "--num-steps", "3", "--topk", "1",
                  "--num-draft-tokens", "4", "--backend", "sglang", "--sglang-version", "0.5.16")
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == str(ZOO["target"])
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(ZOO["eagle"])
    cmd = dry_run("--model", "tiny", "--algorithm", "draft", "--backend", "sglang", "--sglang-version", "0.5.16")
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(ZOO["draft"])
    cmd = dry_run("--model", "tiny", "--algorithm", "NEXTN", "--backend", "sglang", "--sglang-version", "0.5.16")
    assert "--speculative-draft-model-path" not in cmd


def test_specdec_serve_keeps_the_zoo_name_and_gets_the_draft_part():
    cmd = dry_run("--model", "tiny", "--algorithm", "eagle", "--num-steps", "2", "--topk", "1", "--num-draft-tokens",
                  "3", "--backend", "specdec", "--port", "8000")
    assert cmd[1:4] == ["-m", "specdec", "serve"] and cmd[cmd.index("--model") + 1] == "tiny"
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "eagle" and cmd[cmd.index("--k") + 1] == "2"
    # issue 18: `--speculative-draft-model-path tiny` made specdec serve die (tiny is no EAGLE head directory)
    assert flag(cmd, "--speculative-draft-model-path") == str(ZOO["eagle"])
    cmd = dry_run("--model", "tiny", "--algorithm", "STANDALONE", "--backend", "specdec")
    assert flag(cmd, "--speculative-draft-model-path") == str(ZOO["draft"]) and flag(cmd, "--model") == "tiny"
    cmd = dry_run("--model", "tiny", "--algorithm", "EAGLE", "--draft", "tiny", "--backend", "specdec")
    assert flag(cmd, "--speculative-draft-model-path") == str(ZOO["eagle"])  # a zoo name as --draft: its part
    cmd = dry_run("--model", "tiny", "--algorithm", "STANDALONE", "--draft", "/my/draft", "--backend", "specdec")
    assert flag(cmd, "--speculative-draft-model-path") == "/my/draft"  # a directory is taken as it is
    cmd = dry_run("--model", "tiny", "--algorithm", "NEXTN", "--backend", "specdec", "--context-length", "1024",
                  "--max-total-tokens", "5000")
    assert "--speculative-draft-model-path" not in cmd and flag(cmd, "--context-length") == "1024"
    assert "--max-total-tokens" not in cmd  # SGLang's pool: nothing of it applies to specdec serve


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "EAGLE", "--num-steps", "3", "--topk", "1", "--num-draft-tokens", "5"], "topk 1 forces"),
    (["--algorithm", "NEXTN", "--draft", "/d"], "NEXTN uses the target's own MTP layers"),
    (["--algorithm", "EAGLE", "--model", "/some/dir", "--backend", "sglang"], "EAGLE needs a draft model"),
    (["--env", "NOEQUALS"], "--env takes KEY=VALUE"),
])
def test_bad_launch_input_is_one_line(argv, message, capsys):
    assert cli(["launch", *argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_launch_serves_until_ctrl_c_then_stops(tmp_path, monkeypatch, capsys):
    """The verb's own loop, with the stand-in in place of the configured server."""
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    started = []

    def fake_launch(cfg, **kw):
        assert cfg.algorithm == "none" and kw["env"] == {"SGLANG_RECORD_STEP_TIME": "1"}
        started.append(launch(standin("--spawn-child"), progress=False))
        return started[0]

    monkeypatch.setattr(launch_cli, "launch", fake_launch)

    def ctrl_c():
        while not started:
            time.sleep(0.02)
        time.sleep(0.3)
        _thread.interrupt_main()

    threading.Thread(target=ctrl_c, daemon=True).start()
    assert cli(["launch", "--backend", "specdec", "--env", "SGLANG_RECORD_STEP_TIME=1"]) == 0
    assert "serving none at http://127.0.0.1:" in capsys.readouterr().out
    assert started[0].stopped and not pid_alive(started[0].pid)


def test_default_sglang_command_caps_the_kv_pool_and_says_why():
    """Issue 18: NEXTN with no memory flags ran out of memory on one H200 (the target's pool took 126 GB)."""
    nextn = ("--model", "tiny", "--speculative-algorithm", "NEXTN", "--num-steps", "3", "--topk", "1",
             "--num-draft-tokens", "4", "--backend", "sglang", "--sglang-version", "0.5.16")
    lines = dry_run_lines(*nextn)
    cmd = shlex.split(lines[-1])
    assert flag(cmd, "--max-total-tokens") == str(48 * 2048)  # 48 rows x the tiny model's 2048 positions
    assert "--mem-fraction-static" not in cmd and "--context-length" not in cmd
    assert lines[0].startswith("# KV pool: --max-total-tokens 98304 = 48 running requests x 2048 tokens")
    assert "2560 B per token" in lines[0]  # 4 layers + the MTP layer, 2 KV heads of 64, bf16
    cmd = dry_run(*nextn, "--context-length", "1024", "--max-running-requests", "32")
    assert flag(cmd, "--max-total-tokens") == str(32 * 1024) and flag(cmd, "--context-length") == "1024"
    # what the user sized is kept, and no default is added beside it
    lines = dry_run_lines(*nextn, "--mem-fraction-static", "0.3")
    assert len(lines) == 2 and "--max-total-tokens" not in lines[1] and "--mem-fraction-static 0.3" in lines[1]
    assert lines[0].startswith("# in the server's environment: SGLANG_RECORD_STEP_TIME=1 ")  # no pool note
    lines = dry_run_lines(*nextn, "--max-total-tokens", "5000")
    assert len(lines) == 2 and flag(shlex.split(lines[1]), "--max-total-tokens") == "5000"


def test_sglang_without_fa3_gets_triton_attention_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr(launch_cli, "fa3_present", lambda: False)  # the offline pack strips sgl_kernel's FA3
    lines = dry_run_lines("--model", "tiny", "--backend", "sglang", "--sglang-version", "0.5.16")
    assert flag(shlex.split(lines[-1]), "--attention-backend") == "triton" and "no FA3 library" in lines[-2]
    cmd = dry_run("--model", "tiny", "--backend", "sglang", "--sglang-version", "0.5.16", "--attention-backend", "fa3")
    assert flag(cmd, "--attention-backend") == "fa3"
    monkeypatch.setattr(launch_cli, "fa3_present", lambda: None)  # no sgl_kernel at all: SGLang's own choice
    assert "--attention-backend" not in dry_run("--model", "tiny", "--backend", "sglang", "--sglang-version", "0.5.16")
