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
from specdec.serving.lifecycle import RUN_DIR_ENV, launch, pid_alive
from specdec.zoo import resolve

ZOO = resolve("tiny")


def dry_run(*argv) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["launch", *argv, "--dry-run"]) == 0
    return shlex.split(out.getvalue().strip())


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


def test_specdec_serve_keeps_the_zoo_name():
    cmd = dry_run("--model", "tiny", "--algorithm", "eagle", "--num-steps", "2", "--topk", "1", "--num-draft-tokens",
                  "3", "--backend", "specdec", "--port", "8000")
    assert cmd[1:4] == ["-m", "specdec", "serve"] and cmd[cmd.index("--model") + 1] == "tiny"
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "eagle" and cmd[cmd.index("--k") + 1] == "2"


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
