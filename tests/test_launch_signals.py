"""Issue 18: `specdec launch` and `specdec room` started as a script starts them, in the background with
SIGINT ignored (`&` in a script, nohup, systemd), stop their servers' whole sessions on SIGTERM, SIGINT
and SIGHUP, then exit 0 with a line saying so; a taken port is refused before anything starts; EAGLE
and STANDALONE on the zoo start and generate with `specdec serve`.

Every process a test starts is killed in `finally` (the launcher by pid, each server by its session).
"""

import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from test_launch_lifecycle import logged_pids, standin

from specdec.cli import main as cli
from specdec.serving.ops.lifecycle import (
    RUN_DIR_ENV,
    STOP_SIGNALS,
    StopSignal,
    kill_session,
    launch,
    pid_alive,
    reap_stale,
    session_members,
    stop_on_signals,
)
from specdec.serving.ops.room import read_state, stop_room

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).parent
CHAIN = ("--num-steps", "3", "--topk", "1", "--num-draft-tokens", "4")
GENERATE = {"text": "def main(", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
SERVING = re.compile(r"serving \S+ at (http://\S+) \(pid (\d+), log")


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv(RUN_DIR_ENV, str(d))  # pid files and logs of this test only (children inherit it)
    return d


def in_background(argv: list[str]) -> list[str]:
    """argv as a script's `&` starts it: with SIGINT ignored (which a Python keeps ignored unless told)."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]


class Watched:
    """A command started in the background of a script, its output collected line by line."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(in_background(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: re.Pattern | str, timeout: float = 180.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text)
            if m:
                return m
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the last lines
                pytest.fail(f"exited with status {self.proc.returncode} before {pattern!r}:\n{self.text}")
            time.sleep(0.05)
        pytest.fail(f"no {pattern!r} after {timeout:.0f} s:\n{self.text}")

    def stop(self, sig: int, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {timeout:.0f} s after {signal.Signals(sig).name}:\n{self.text}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def cleanup(watched: Watched, server_pids: list[int]) -> None:
    """Whatever a failed test left: the launcher, its servers' sessions, and orphans its pid files name."""
    watched.kill()
    for pid in server_pids:
        if session_members(pid):
            kill_session(pid, 2.0)
    reap_stale(grace=2.0)


def gone(pids: list[int], within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def test_the_harness_starts_commands_with_sigint_ignored():
    probe = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
    out = subprocess.run(in_background([sys.executable, "-c", probe]), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_stop_on_signals_raises_once_whatever_was_inherited_and_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with pytest.raises(StopSignal, match="SIGHUP") as stop, stop_on_signals():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the handler raises at the next bytecode
        assert stop.value.signum == signal.SIGHUP and isinstance(stop.value, KeyboardInterrupt)
        with stop_on_signals():
            with pytest.raises(StopSignal, match="SIGTERM"):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            os.kill(os.getpid(), signal.SIGINT)  # a second signal while stopping: ignored
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # the inherited disposition is back
    finally:
        for s, h in before.items():
            signal.signal(s, h)


# ----- specdec launch
@pytest.mark.slow
@pytest.mark.parametrize("sig, algorithm", [(signal.SIGINT, "none"), (signal.SIGTERM, "EAGLE"),
                                            (signal.SIGHUP, "STANDALONE")])
def test_launch_in_the_background_serves_then_stops_on_each_signal(sig, algorithm):
    """The real `specdec launch` (EAGLE and STANDALONE with the zoo's draft parts, issue 18 too)."""
    chain = CHAIN if algorithm != "none" else ()
    launcher = Watched([sys.executable, "-m", "specdec", "launch", "--backend", "specdec", "--model", "tiny",
                        "--speculative-algorithm", algorithm, *chain, "--timeout", "170"])
    pids: list[int] = []
    try:
        url, pid = launcher.wait_for(SERVING).groups()
        pids = session_members(int(pid))
        assert int(pid) in pids
        r = requests.post(url + "/generate", json=GENERATE, timeout=60)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8, r.text
        assert launcher.stop(sig) == 0, launcher.text
        assert f"specdec launch: {signal.Signals(sig).name}, stopping the server (pid {pid})" in launcher.text
        assert launcher.text.rstrip().endswith("specdec launch: stopped")
        assert gone(pids) == [] and session_members(int(pid)) == []
    finally:
        cleanup(launcher, [int(p) for p in pids[:1]])


STANDIN_LAUNCH = """
import sys
sys.path.insert(0, {tests!r})
from test_launch_lifecycle import standin
import specdec.cli.launch as verb
from specdec.cli import main
from specdec.serving.ops import lifecycle
verb.launch = lambda cfg, **kw: lifecycle.launch(standin(*{options!r}), timeout=kw["timeout"], progress=False)
sys.exit(main(["launch", "--backend", "specdec"]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_the_server_starts_stops_it(sig, run_dir):
    """`specdec launch`'s own code with the stand-in in place of its server, still starting (and its child)."""
    code = STANDIN_LAUNCH.format(tests=str(TESTS), options=["--startup-delay", "60", "--spawn-child"])
    launcher = Watched([sys.executable, "-c", code])
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not pids and time.monotonic() < deadline and launcher.proc.poll() is None:
            logs = [log.read_text() for log in run_dir.glob("server-*.log")]
            pids = next((logged_pids(t) for t in logs if "stand-in listening" in t), [])
            time.sleep(0.05)
        assert pids, f"the stand-in did not start:\n{launcher.text}"
        assert launcher.stop(sig) == 0, launcher.text
        assert f"specdec launch: {signal.Signals(sig).name} while the server was starting; stopped" in launcher.text
        assert gone(pids) == [] and not list(run_dir.glob("*.json"))
    finally:
        cleanup(launcher, pids[:1])


def test_a_taken_port_is_one_line_and_nothing_starts(run_dir, capsys):
    """Issue 18: the other server's answer to /health_generate was taken for ours ("serving none at ...")."""
    with launch(standin(), progress=False) as other:
        port = int(other.url.rsplit(":", 1)[1])
        logs = set(run_dir.glob("server-*.log"))
        assert cli(["launch", "--backend", "specdec", "--port", str(port), "--timeout", "30"]) == 1
        out = capsys.readouterr().out
        assert out.strip() == (f"specdec launch: port {port} on 127.0.0.1 is already taken (another server?): choose "
                               "another port, or leave it unset for a free one")
        assert set(run_dir.glob("server-*.log")) == logs and other.alive()  # nothing started, the other one unharmed


# ----- specdec room
@pytest.mark.slow
def test_a_room_in_the_background_serves_eagle_and_standalone_then_stops_on_sighup(tmp_path):
    csv_path, state_file = tmp_path / "room.csv", tmp_path / "room.json"
    room = Watched([sys.executable, "-m", "specdec", "room", "--engine", "specdec", "--students", "1",
                    "--algorithm", "EAGLE,STANDALONE", *CHAIN, "--port-base", "32400", "--out", str(csv_path),
                    "--state", str(state_file), "--grace", "5", "--timeout", "170"])
    pids: list[int] = []
    try:
        room.wait_for("all 2 servers ready")
        pids = [p for s in read_state(state_file)["servers"] for p in session_members(s["pid"])]
        rows = list(csv.DictReader(csv_path.open()))
        assert [r["name"] for r in rows] == ["student-01-eagle", "student-01-standalone"]
        for r in rows:
            ok = requests.post(r["url"] + "/generate", json=GENERATE, headers={"Authorization": f"Bearer {r['key']}"},
                               timeout=60)
            assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 8, ok.text
        assert room.stop(signal.SIGHUP) == 0, room.text
        assert "stopping the room (SIGHUP)" in room.text and room.text.rstrip().endswith("room stopped")
        assert gone(pids) == [] and not state_file.exists()
    finally:
        room.kill()
        stop_room(state_file, grace=2)
        cleanup(room, pids)
