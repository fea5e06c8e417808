"""The launcher leaves no process behind: 10 start/stop cycles, a kill mid-start (timeout, Ctrl-C,
the launching Python killed), a server that ignores SIGTERM, a crash while starting, atexit.

Processes are checked by pid (/proc, or os.kill(pid, 0)); zombies count as gone.
The generic tests start the real `specdec serve`; a stand-in server (tests/fixtures/standin_server.py)
plays the misbehaving ones (slow to start, deaf to SIGTERM, crashing).
"""

import _thread
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specdec.serving.measure.client import Client, ClientError
from specdec.serving.ops.launch import LaunchConfig
from specdec.serving.ops.lifecycle import (
    RUN_DIR_ENV,
    ServerCommand,
    ServerError,
    brief,
    launch,
    pid_alive,
    reap_stale,
    session_members,
    start_ticks,
)
from specdec.serving.ops.ports import free_port

STANDIN = Path(__file__).parent / "fixtures" / "standin_server.py"
ROOT = Path(__file__).resolve().parents[1]


def standin(*options: str, api_key: str | None = None) -> ServerCommand:
    """tests/fixtures/standin_server.py on a port chosen at launch."""
    return ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", *options), api_key=api_key)


@pytest.fixture
def server_spec():
    """The server the generic tests start: `specdec serve` with the tiny zoo's MTP layer (NEXTN)."""
    return LaunchConfig(model="tiny", algorithm="NEXTN", num_steps=3, topk=1, num_draft_tokens=4, backend="specdec")


def processes_with(arg: str) -> list[int]:
    """Live processes whose command line holds `arg` (read from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if arg in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") and pid_alive(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv(RUN_DIR_ENV, str(d))  # pid files and logs of this test only (children inherit it)
    return d


def logged_pids(text: str) -> list[int]:
    """The stand-in logs 'pid P child C' when it starts."""
    m = re.search(r"pid (\d+) child (\d+|None)", text)
    assert m, f"no pids in the log:\n{text}"
    return [int(x) for x in m.groups() if x != "None"]


def assert_gone(pids, within: float = 5.0):
    deadline = time.monotonic() + within
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if pid_alive(p)], f"left running: {[p for p in pids if pid_alive(p)]}"


def test_ten_start_stop_cycles_leave_no_process(server_spec, run_dir):
    seen, urls = set(), set()
    for _ in range(10):
        with launch(server_spec, timeout=120, progress=False) as server:
            members = session_members(server.pid)
            assert server.pid in members and Client(server.url).health()
            seen.update(members)
            urls.add(server.url)
        assert_gone(members)
    assert len(seen) >= 10 and len(urls) >= 2  # a server per cycle, on free ports
    assert not list(run_dir.glob("*.json")), "a pid file outlived its server"


def test_specdec_serve_killed_mid_start_leaves_no_process(server_spec):
    """The real server, given too little time to come up (its Python is still importing torch)."""
    port = free_port()
    with pytest.raises(ServerError) as err:
        launch(server_spec.replace(port=port), timeout=0.5, progress=False)
    assert "specdec" in err.value.log_tail or err.value.log_path is not None
    deadline = time.monotonic() + 5
    while processes_with(f"--port {port}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"--port {port}") == []


def test_timeout_mid_start_kills_the_server_and_reports_its_log():
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="not healthy after 2 s") as err:
        launch(standin("--startup-delay", "60", "--spawn-child"), timeout=2, progress=False)
    assert "stand-in listening" in str(err.value) and time.monotonic() - t0 < 10
    assert_gone(logged_pids(err.value.log_tail))


def test_ctrl_c_mid_start_leaves_no_process(run_dir):
    def interrupt_once_started():  # Ctrl-C in a notebook cell raises KeyboardInterrupt in the main thread
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any("stand-in listening" in log.read_text() for log in run_dir.glob("server-*.log")):
                break
            time.sleep(0.02)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launch(standin("--startup-delay", "60", "--spawn-child"), timeout=60, progress=False)
    (log,) = run_dir.glob("server-*.log")
    assert_gone(logged_pids(log.read_text()))
    assert not list(run_dir.glob("*.json"))


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period():
    server = launch(standin("--ignore-sigterm", "--spawn-child"), grace=0.5, progress=False)
    pids = session_members(server.pid)
    t0 = time.monotonic()
    server.stop()
    assert 0.4 < time.monotonic() - t0 < 5  # waited out the grace period, then SIGKILL
    assert_gone(pids)
    server.stop()  # a second stop is harmless


def test_a_crash_while_starting_raises_with_the_last_log_lines():
    with pytest.raises(ServerError, match="exited with status 3") as err:
        launch(standin("--startup-delay", "60", "--crash-after", "0.3"), timeout=30, progress=False)
    assert "fatal error while loading the model" in err.value.log_tail
    assert err.value.log_path.exists()


def test_a_long_start_error_keeps_its_first_line_and_its_last():
    """Benchmarks cut a server's start error to fit a log line and a summary: the exception is at the end of the
    log's traceback (a cut from the start lost it in an SGLang fp32 start, 2026-11-29) and what failed at the start."""
    trace = "\n".join(f'  File "/sglang/srt/layer{i}.py", line {i}, in forward' for i in range(200))
    text = str(ServerError("server exited with status -9 before it was healthy", Path("/out/3,1,4.log"),
                           trace + "\nRuntimeError: rmsnorm failed to dispatch data type Float"))
    cut = brief(text, 1500)
    assert len(text) > 1500 >= len(cut)
    assert cut.startswith("server exited with status -9 before it was healthy (log: /out/3,1,4.log)\n")
    assert cut.endswith("RuntimeError: rmsnorm failed to dispatch data type Float") and "[...]" in cut
    assert brief("short", 1500) == "short"


def test_a_missing_executable_is_one_line():
    with pytest.raises(ServerError, match="cannot start /no/such/python"):
        launch(ServerCommand(("/no/such/python", "--port", "{port}")), progress=False)


LAUNCHER = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that finds it hung asks where it is
sys.path.insert(0, {tests!r})
from test_launch_lifecycle import standin
from specdec.serving.ops.lifecycle import launch
server = launch(standin(*{options!r}), timeout=120, progress=False)
print("started", server.pid, flush=True)
time.sleep({linger})
"""


def signal_masks(pid: int) -> dict[str, int]:
    """A process's blocked, ignored and caught signals, as /proc/PID/status shows them (bit n - 1: signal n)."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return {k: int(fields[k], 16) for k in ("SigBlk", "SigIgn", "SigCgt")}


def default_stop_signals() -> None:
    """In the launcher's child before exec: SIGTERM and SIGHUP at their default disposition, whatever the suite
    inherited. Under `nohup make test` SIGHUP arrives ignored, and a launcher rightly leaves an inherited SIG_IGN alone
    (lifecycle._guard_api_signals): the SIGHUP case then hung in every run started with nohup, loaded or not."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_launcher(options, linger: float) -> subprocess.Popen:
    code = LAUNCHER.format(tests=str(Path(__file__).parent), options=list(options), linger=linger)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=default_stop_signals)


def wait_for_log_pids(run_dir: Path, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in run_dir.glob("server-*.log"):
            if "stand-in listening" in log.read_text() and list(run_dir.glob("*.json")):
                return logged_pids(log.read_text())
        time.sleep(0.05)
    raise AssertionError("the launcher never started its server")


def test_a_launcher_killed_mid_start_leaves_an_orphan_that_the_next_launch_reaps(run_dir):
    launcher = run_launcher(["--startup-delay", "60", "--spawn-child"], linger=0)
    pids = wait_for_log_pids(run_dir)
    launcher.kill()  # SIGKILL: no finally, no atexit; the server lives in its own session
    launcher.wait()
    time.sleep(0.2)
    assert all(map(pid_alive, pids)), "the orphan should still run before the next launch"
    with launch(standin(), progress=False):  # the next launch reaps what the dead launcher left
        assert_gone(pids)
    assert not list(run_dir.glob("*.json"))


def test_atexit_stops_a_server_the_program_forgot(run_dir):
    launcher = run_launcher(["--spawn-child"], linger=0)  # exits normally without stopping it
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0 and "started" in out
    (log,) = run_dir.glob("server-*.log")
    assert_gone(logged_pids(log.read_text()))


def test_reap_spares_a_live_launchers_server_then_reaps_it_once_the_launcher_dies(run_dir):
    launcher = run_launcher(["--spawn-child"], linger=600)  # killed below: it must outlive whatever the test waits for
    assert launcher.stdout.readline().startswith("started")
    pids = wait_for_log_pids(run_dir)
    try:
        assert reap_stale() == [] and all(map(pid_alive, pids))  # another notebook's server: left alone
    finally:
        launcher.kill()  # SIGKILL: no handler, no atexit: an orphan
        launcher.wait()
    assert reap_stale() == [pids[0]]
    assert_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_a_python_that_launched_servers_stops_them_first(sig, run_dir):
    """A notebook kernel or script killed politely: its servers go with it, and it still dies of the signal."""
    launcher = run_launcher(["--spawn-child"], linger=600)  # signalled below: a launcher that ignored it would exit 0
    try:
        assert launcher.stdout.readline().startswith("started")
        pids = wait_for_log_pids(run_dir)
        masks = signal_masks(launcher.pid)
        assert masks["SigCgt"] & (1 << (sig - 1)) and not masks["SigBlk"] & (1 << (sig - 1)), masks  # caught, not blocked
        launcher.send_signal(sig)
        try:  # it stops its servers (bounded: about 20 s), then dies of the signal as the default disposition would
            rc = launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:  # say where it hung
            launcher.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack, on the test's stderr
            time.sleep(2)
            raise AssertionError(f"the launcher outlived {sig.name} by 120 s; its masks before: {masks}, now: "
                                 f"{signal_masks(launcher.pid)}") from None
        assert rc == -sig
        assert_gone(pids)
        assert not list(run_dir.glob("*.json"))  # stopped, not orphaned: nothing for the next launch to reap
    finally:
        launcher.kill()
        launcher.wait()
        reap_stale()


def test_reap_never_kills_a_reused_pid(run_dir):
    """A pid file whose pid now belongs to another process (its start time differs) is dropped, not acted on."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / f"{bystander.pid}.json").write_text(json.dumps(
            {"pid": bystander.pid, "ticks": (start_ticks(bystander.pid) or 0) - 1, "owner": dead.pid, "owner_ticks": 0}))
        (run_dir / "garbage.json").write_text("{not json")
        assert reap_stale() == []
        assert pid_alive(bystander.pid) and not list(run_dir.glob("*.json"))
    finally:
        bystander.kill()
        bystander.wait()


def test_api_key_protects_the_server_and_the_launcher_uses_it():
    with launch(standin("--api-key", "sesame", api_key="sesame"), progress=False) as server:
        assert server.client().server_info().version == "0.5.16"
        with pytest.raises(ClientError, match="HTTP 401"):
            Client(server.url).server_info()


def test_pid_file_names_the_server_and_its_launcher(run_dir):
    with launch(standin(), progress=False) as server:
        rec = json.loads((run_dir / f"{server.pid}.json").read_text())
        assert rec["owner"] == os.getpid() and rec["ticks"] == start_ticks(server.pid) and rec["url"] == server.url


def test_one_port_test_for_the_launcher_the_room_and_preflight():
    """ports.port_free is the one test (a bind, with SO_REUSEADDR as the servers set it); the launcher, the room and
    preflight use it too."""
    import socket

    from specdec.serving.ops import lifecycle, ports, preflight, room

    assert room.port_free is ports.port_free and preflight.port_free is ports.port_free
    assert lifecycle.port_taken is ports.port_taken and lifecycle.free_port is ports.free_port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not ports.port_free(port) and ports.port_taken("127.0.0.1", port)
    assert ports.port_free(port)
