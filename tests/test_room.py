"""`specdec room`: N servers for a class, a CSV of name,url,key, and no process left behind by --stop,
Ctrl-C, a server that fails to start, or a room that died.

The command runs as a real class would run it, with `specdec serve` on the tiny zoo (one CPU thread
each); the failure paths use the stand-in server of tests/fixtures, which starts in milliseconds.
Processes are checked in /proc: a server's whole session (it and anything it started) must be gone.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from test_launch_lifecycle import STANDIN, processes_with
from test_notebooks_lab3 import assert_solution_ran
from test_launch_lifecycle import standin as standin_command

import specdec.cli.room as verb
from specdec.cli import main
from specdec.serving.ops.gpu import GIB, MIB, Gpu, ServerNeeds
from specdec.serving.ops.launch import LaunchConfig
from specdec.serving.ops.lifecycle import RUN_DIR_ENV, ServerCommand, ServerError, launch, pid_alive, session_members
from specdec.serving.ops.room import (
    ENV_KEY,
    ENV_SPEC_URL,
    ENV_URL,
    Room,
    RoomError,
    Seat,
    export_line,
    gpu_plans,
    jupyter_lines,
    lab_servers,
    new_key,
    pick_ports,
    pick_spaced_ports,
    read_state,
    seat_names,
    sglang_seats,
    specdec_seats,
    stop_room,
    student_env,
)

ROOT = Path(__file__).resolve().parents[1]
GENERATE = {"text": "def main(", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv(RUN_DIR_ENV, str(d))  # logs, pid files and the room's state of this test only
    return d


def gone(pids, within: float = 10.0) -> list[int]:
    """The pids still running after `within` seconds (zombies count as gone)."""
    deadline = time.monotonic() + within
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def sessions(state: dict) -> list[int]:
    """Every live process of the room's servers' sessions."""
    return [p for s in state["servers"] for p in session_members(s["pid"])]


# ----- planning ----------------------------------------------------------------------------------------
def test_names_keys_and_ports():
    assert seat_names(3) == ["student-01", "student-02", "student-03"] and seat_names(120)[0] == "student-001"
    keys = {new_key() for _ in range(1000)}
    assert len(keys) == 1000 and all(len(k) == 24 and k.isascii() and k.isalnum() for k in keys)  # never "-..."
    ports, skipped = pick_ports(3, 30000, is_free=lambda p, host: p not in (30001, 30002))
    assert ports == [30000, 30003, 30004] and skipped == [30001, 30002]
    with pytest.raises(RoomError, match="not enough free ports"):
        pick_ports(2, 65535, is_free=lambda p, host: True)


def test_sglang_seats_share_the_gpus_and_carry_their_keys():
    gpus = [Gpu(0, "H200", 143 * GIB, 140 * GIB, "GPU-a"), Gpu(1, "H200", 143 * GIB, 70 * GIB, "GPU-b")]
    needs = ServerNeeds(11 * MIB, 2560)
    plans = gpu_plans(5, gpus, needs, 0.2)
    assert {i: p.servers for i, p in plans.items()} == {0: 3, 1: 2}
    base = LaunchConfig("/zoo/tiny/target", "NEXTN", num_steps=3, topk=1, num_draft_tokens=4, backend="sglang",
                        attention_backend="triton", cuda_graph_max_bs=16)
    names, ports, keys = seat_names(5), list(range(30000, 30005)), [new_key() for _ in range(5)]
    seats = sglang_seats([base] * 5, names, ports, keys, gpus, plans, list(range(30005, 30010)))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in seats] == ["GPU-a", "GPU-b", "GPU-a", "GPU-b", "GPU-a"]
    argv = seats[1].spec.command("0.5.16")
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--port"] == "30001" and flag["--api-key"] == keys[1] and flag["--speculative-algorithm"] == "NEXTN"
    assert flag["--nccl-port"] == "30006" and flag["--attention-backend"] == "triton"
    assert flag["--mem-fraction-static"] == "0.8" and int(flag["--max-total-tokens"]) == plans[1].max_total_tokens
    assert plans[1].max_total_tokens == (int(70 * GIB * 0.8 / 2) - 11 * MIB) // 2560
    assert seats[1].url == "http://127.0.0.1:30001"
    cpu = specdec_seats([LaunchConfig("tiny", backend="specdec", host="0.0.0.0")], names[:1], ports[:1], keys[:1], "node7")
    assert cpu[0].url == "http://node7:30000" and cpu[0].spec.command()[-2:] == ["--api-key", keys[0]]


# ----- the room as a class runs it -----------------------------------------------------------------------
def start_room(tmp_path, *args) -> tuple[subprocess.Popen, Path, Path]:
    """The room as a script's `&` starts it: with SIGINT ignored (Ctrl-C and --stop must work all the same)."""
    csv_path, state = tmp_path / "room.csv", tmp_path / "room.json"
    room = subprocess.Popen(["sh", "-c", 'trap "" INT; exec "$@"', "sh",
                             sys.executable, "-m", "specdec", "room", "--engine", "specdec", "--out", str(csv_path),
                             "--state", str(state), "--grace", "5", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while not csv_path.exists():
        if room.poll() is not None or time.monotonic() > deadline:
            room.kill()
            pytest.fail(f"the room did not start:\n{room.communicate()[0]}")
        time.sleep(0.1)
    return room, csv_path, state


def specdec_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, check=False, cwd=ROOT,
                          timeout=timeout)


@pytest.mark.slow
def test_a_room_of_four_serves_each_student_with_its_key_and_stop_leaves_nothing(tmp_path):
    room, csv_path, state_file = start_room(tmp_path, "--students", "4", "--port-base", "31500")
    try:
        rows = list(csv.DictReader(csv_path.open()))
        assert [r["name"] for r in rows] == ["student-01", "student-02", "student-03", "student-04"]
        assert len({r["url"] for r in rows}) == 4 and len({r["key"] for r in rows}) == 4
        assert csv_path.read_text().splitlines()[0] == "name,url,key" and oct(csv_path.stat().st_mode)[-3:] == "600"
        for r in rows:
            ok = requests.post(r["url"] + "/generate", json=GENERATE, headers={"Authorization": f"Bearer {r['key']}"},
                               timeout=60)
            assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4
            assert requests.post(r["url"] + "/generate", json=GENERATE, timeout=60).status_code == 401
        other = {"Authorization": f"Bearer {rows[1]['key']}"}  # a neighbour's key does not open this one
        assert requests.post(rows[0]["url"] + "/generate", json=GENERATE, headers=other, timeout=60).status_code == 401

        state = read_state(state_file)
        assert state["pid"] == room.pid and [s["url"] for s in state["servers"]] == [r["url"] for r in rows]
        pids = sessions(state)
        assert len(pids) >= 4

        with pytest.raises(RoomError, match="a room is already running"), Room(
                specdec_seats([LaunchConfig("tiny", backend="specdec")], ["x"], [31599], ["k"]), state_file) as second:
            second.start()
        assert read_state(state_file) == state  # the refused room left the running one's state alone

        stop = specdec_cli("room", "--stop", "--state", str(state_file))  # from another process, as from another shell
        assert stop.returncode == 0 and "room stopped: 4 server(s)" in stop.stdout, stop.stdout + stop.stderr
        assert room.wait(timeout=30) == 0
        assert gone(pids + [room.pid]) == []
        assert not state_file.exists()
        assert "room stopped" in room.stdout.read()
    finally:
        if room.poll() is None:
            room.kill()
            stop_room(state_file)
    assert stop_room(state_file) == f"no room is running (no state file at {state_file})"


def test_a_server_that_fails_to_start_is_named_and_the_others_are_stopped(tmp_path):
    def standin(port, *options):
        return ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", *options), port=port, api_key="k")

    seats = [Seat(f"student-0{i + 1}", standin(31700 + i, "--spawn-child", "--api-key", "k")) for i in range(3)]
    seats.append(Seat("student-04", standin(31703, "--startup-delay", "60", "--crash-after", "1")))
    lines = []
    with pytest.raises(RoomError) as err, Room(seats, tmp_path / "room.json", grace=2, report=lines.append) as room:
        room.start()
        state = read_state(tmp_path / "room.json")
        room.wait_healthy(timeout=60)
    message = str(err.value)
    assert message.startswith("student-04 (http://127.0.0.1:31703) exited with status 3 before it was healthy")
    assert "fatal error while loading the model" in message and "student-04.log" in message
    assert sum("ready at" in ln for ln in lines) == 3  # the others came up, and were stopped
    assert gone(sessions(state)) == [] and not (tmp_path / "room.json").exists()


def test_a_server_that_dies_after_answering_fails_the_start_and_the_wait_is_reported(tmp_path):
    """The room's wait is lifecycle.wait_all_healthy's: a server that answered and then died while another was still
    starting fails the start as well (named, with its log), and the room says whom it waits for every `every` s.
    (student-01 dies 4 s after it listens: time for the room to see it answer on a loaded machine.)"""
    seats = [Seat("student-01", ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", "--crash-after", "4"),
                                               port=31710)),
             Seat("student-02", ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", "--startup-delay", "60"),
                                               port=31711))]
    lines = []
    with pytest.raises(RoomError) as err, Room(seats, tmp_path / "room.json", grace=2, report=lines.append) as room:
        room.start()
        state = read_state(tmp_path / "room.json")
        room.wait_healthy(timeout=30, every=0.5)
    assert str(err.value).startswith("student-01 (http://127.0.0.1:31710) exited with status 3 while the others were "
                                     "starting; log "), str(err.value)
    assert any(ln.startswith("  student-01 ready at http://127.0.0.1:31710") for ln in lines), lines
    assert any(ln.startswith("  waiting for 1: student-02 (") for ln in lines), lines
    assert gone(sessions(state)) == [] and not (tmp_path / "room.json").exists()


def test_a_room_that_is_not_up_in_time_names_every_server_it_waits_for(tmp_path):
    seats = [Seat(f"student-0{i + 1}", ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", *options),
                                                     port=31720 + i))
             for i, options in enumerate([(), ("--startup-delay", "60"), ("--startup-delay", "60")])]
    lines = []
    with pytest.raises(RoomError) as err, Room(seats, tmp_path / "room.json", grace=2, report=lines.append) as room:
        room.start()
        room.wait_healthy(timeout=8)  # long enough for student-01 to answer on a loaded machine
    assert str(err.value).startswith("not healthy after 8 s: student-02, student-03\n--- student-02: "), str(err.value)
    assert sum("ready at" in ln for ln in lines) == 1


@pytest.mark.slow
def test_the_command_reports_a_server_that_cannot_start(tmp_path):
    r = specdec_cli("room", "--students", "2", "--engine", "specdec", "--model", str(tmp_path / "no-model"),
                    "--out", str(tmp_path / "room.csv"), "--state", str(tmp_path / "room.json"), "--port-base", "31800")
    assert r.returncode == 1
    assert "exited with status 2 before it was healthy" in r.stderr and "no-model" in r.stderr, r.stderr
    assert "stopping the other servers" in r.stdout
    assert not (tmp_path / "room.csv").exists() and not (tmp_path / "room.json").exists()
    assert not list((tmp_path / "run").glob("*.json"))  # no pid file left: every server was stopped


def test_stop_kills_the_servers_of_a_room_that_died(tmp_path):
    seats = [Seat(f"student-0{i + 1}", ServerCommand((sys.executable, str(STANDIN), "--port", "{port}", "--spawn-child"),
                                                    port=31900 + i)) for i in range(2)]
    room = Room(seats, tmp_path / "room.json", report=lambda _: None)
    room.start()
    room.wait_healthy(timeout=30)
    state = read_state(tmp_path / "room.json")
    pids = sessions(state)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state["pid"] = dead.pid  # as if the room had been killed with SIGKILL: nobody will stop its servers
    (tmp_path / "room.json").write_text(json.dumps(state))
    assert stop_room(tmp_path / "room.json", grace=2) == "room stopped: 2 server(s); killed student-01, student-02 directly"
    assert gone(pids) == [] and not (tmp_path / "room.json").exists()
    room.stop()  # nothing left to stop: harmless


def test_the_sglang_plan_on_a_gpu_node_without_one(monkeypatch, capsys):
    """The command's SGLang path, planned against the facts of an H200 with the offline pack (no FA3)."""
    monkeypatch.setattr(verb, "query_gpus", lambda: [Gpu(0, "NVIDIA H200", 143 * GIB, 140 * GIB, "GPU-a")])
    monkeypatch.setattr(verb, "fa3_present", lambda: False)
    assert main(["room", "--students", "3", "--engine", "sglang", "--algorithm", "EAGLE", "--port-base", "32000",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("student-")]
    assert len(lines) == 3 and "--attention-backend triton" in out and "3 server(s) on 140.0 GiB free" in out
    for ln in lines:
        assert "CUDA_VISIBLE_DEVICES=GPU-a" in ln and "sglang.launch_server" in ln and "--api-key" in ln
        assert "--speculative-draft-model-path" in ln and ln.split("--speculative-draft-model-path ")[1].split()[0].endswith(
            "tiny/eagle")
        assert "--mem-fraction-static 0.8" in ln and "--max-total-tokens" in ln and "--nccl-port" in ln
    monkeypatch.setattr(verb, "query_gpus", list)
    assert main(["room", "--students", "3", "--engine", "sglang", "--dry-run"]) == 2
    assert "needs a GPU, and none is visible" in capsys.readouterr().err


def test_several_algorithms_give_each_student_a_server_of_each_with_one_key(capsys):
    assert main(["room", "--students", "2", "--engine", "specdec", "--algorithm", "none,NEXTN", "--num-steps", "3",
                 "--topk", "1", "--num-draft-tokens", "4", "--port-base", "32100", "--dry-run"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("student-")]
    names = [ln.split()[0] for ln in lines]
    assert names == ["student-01-plain", "student-01-nextn", "student-02-plain", "student-02-nextn"]
    keys = [ln.split("--api-key ")[1].split()[0] for ln in lines]
    assert keys[0] == keys[1] != keys[2] == keys[3]
    assert "--k 3" in lines[1] and "--k" not in lines[0]  # the plain server takes none of the chain settings
    assert main(["room", "--students", "2", "--engine", "specdec", "--algorithm", "none,plain", "--dry-run"]) == 2
    assert "distinct" in capsys.readouterr().err


def test_nccl_ports_are_spaced_and_skip_busy_windows():
    busy = {31016, 31034}
    ports = pick_spaced_ports(3, 31000, stride=16, is_free=lambda p, host: p not in busy)
    assert ports == [31000, 31048, 31064]  # 31016 is busy, 31032's window holds 31034


# ----- Lab 3 on the room's servers (issue 19, section 1) ----------------------------------------------------
def test_each_student_gets_the_lines_lab_3_reads():
    base = [LaunchConfig("tiny", backend="specdec"), LaunchConfig("tiny", "NEXTN", num_steps=3, topk=1,
                                                                  num_draft_tokens=4, backend="specdec")]
    names = ["student-01-plain", "student-01-nextn", "student-02-plain", "student-02-nextn"]
    seats = specdec_seats(base * 2, names, [30000, 30001, 30002, 30003], ["k1", "k1", "k2", "k2"],
                          students=["student-01", "student-01", "student-02", "student-02"])
    envs = student_env(seats)
    assert envs == {"student-01": {ENV_URL: "http://127.0.0.1:30000", ENV_SPEC_URL: "http://127.0.0.1:30001", ENV_KEY: "k1"},
                    "student-02": {ENV_URL: "http://127.0.0.1:30002", ENV_SPEC_URL: "http://127.0.0.1:30003", ENV_KEY: "k2"}}
    assert export_line(envs["student-01"]) == ("export SPECDEC_URL=http://127.0.0.1:30000 "
                                               "SPECDEC_SPEC_URL=http://127.0.0.1:30001 SPECDEC_API_KEY=k1")
    assert jupyter_lines(envs["student-02"])[-1] == "%env SPECDEC_API_KEY=k2"
    # one speculative server each: the lab starts its own plain one
    only = specdec_seats(base[1:], ["student-01"], [30000], ["k"])
    assert student_env(only) == {"student-01": {ENV_SPEC_URL: "http://127.0.0.1:30000", ENV_KEY: "k"}}


def test_lab_servers_take_the_rooms_and_start_only_what_is_missing():
    plain_cmd, spec_cmd = standin_command("--plain"), standin_command()
    lines = []
    with launch(standin_command("--plain", "--api-key", "k"), progress=False) as room_plain, \
            launch(standin_command("--api-key", "k"), progress=False) as room_spec:
        env = {ENV_URL: room_plain.url, ENV_SPEC_URL: room_spec.url, ENV_KEY: "k"}
        plain, spec = lab_servers(plain_cmd, spec_cmd, timeout=30, environ=env, report=lines.append)
        assert (plain.url, spec.url) == (room_plain.url, room_spec.url) and not plain.started and not spec.started
        assert lines == [f"using the room's servers at plain {room_plain.url}, speculative {room_spec.url}"]
        assert plain.client().server_info().speculative_algorithm is None  # the key goes with the client
        plain.stop(), spec.stop()  # the room's: left running
        assert room_plain.alive() and room_spec.alive() and room_plain.probe() and room_spec.probe()

        lines.clear()  # only the speculative server in the room: our own plain one, stopped by stop()
        plain, spec = lab_servers(plain_cmd, spec_cmd, timeout=30, environ={ENV_SPEC_URL: room_spec.url, ENV_KEY: "k"},
                                  report=lines.append)
        assert plain.started and not spec.started and plain.pid
        assert lines[0].startswith(f"using the room's servers at speculative {room_spec.url}; started our own: plain")
        plain.stop()
        assert gone([plain.pid]) == [] and room_spec.alive()

        for env, message in (({ENV_URL: room_spec.url, ENV_KEY: "k"}, "runs EAGLE: SPECDEC_URL is for the plain"),
                             ({ENV_SPEC_URL: room_plain.url, ENV_KEY: "k"}, "is not speculative"),
                             ({ENV_URL: room_plain.url, ENV_KEY: "wrong"}, "HTTP 401"),
                             ({ENV_URL: "http://127.0.0.1:9"}, "cannot reach http://127.0.0.1:9")):
            with pytest.raises(ServerError, match=message):
                lab_servers(plain_cmd, spec_cmd, timeout=30, environ=env, report=lines.append)

    lines.clear()  # no room: both our own, and the line says how to use a room's
    plain, spec = lab_servers(plain_cmd, spec_cmd, timeout=30, environ={}, report=lines.append)
    try:
        assert plain.started and spec.started and lines[0].startswith("started our own: plain http://127.0.0.1:")
        assert "set SPECDEC_URL, SPECDEC_API_KEY and SPECDEC_SPEC_URL" in lines[0]
    finally:
        plain.stop(), spec.stop()
    assert gone([plain.pid, spec.pid]) == []


def test_lab_servers_start_both_at_once_and_a_crash_stops_the_other():
    """An SGLang start takes minutes on a fresh GPU node (207.6 s for Lab 3's two one after the other,
    benchmarks/logs/gpu_notebooks.log): the two start together. The plain stand-in answers only after 6 s; the
    speculative one was started within 3 s of it, not after it. One that crashes takes the other down with it."""
    slow_plain, spec_cmd = standin_command("--plain", "--startup-delay", "6"), standin_command()
    plain, spec = lab_servers(slow_plain, spec_cmd, timeout=60, environ={}, report=lambda line: None)
    try:
        hz = os.sysconf("SC_CLK_TCK")
        assert plain.started and spec.started and abs(spec.ticks - plain.ticks) / hz < 3, (plain.ticks, spec.ticks)
    finally:
        plain.stop(), spec.stop()
    assert gone([plain.pid, spec.pid]) == []
    # The plain stand-in would answer only after ten minutes, past the 60 s allowed: the speculative one's crash
    # is reported at once, not after waiting for the plain one (which would end in "not healthy after 60 s").
    # A value no other test's stand-in uses: its processes are found by it.
    waiting = ("--startup-delay", "600.25")
    with pytest.raises(ServerError, match="exited with status 3") as err:
        lab_servers(standin_command("--plain", *waiting), standin_command("--crash-after", "0.5"),
                    timeout=60, environ={}, report=lambda line: None)
    assert "fatal error while loading the model" in err.value.log_tail
    assert processes_with(" ".join(waiting)) == [], "the plain server outlived the failed start"


def test_servers_sized_by_a_fraction_of_free_memory_start_one_after_the_other(monkeypatch):
    """SGLang servers whose KV cache is a fraction of the memory each finds free cannot start side by side (on an
    H200 the second counted the first's cache as its own weights and exited): lab_servers starts the second once
    the first answers. Stand-ins take the SGLang servers' place; the plain one answers after 3 s."""
    import specdec.serving.ops.room as room_module

    sglang = dict(backend="sglang", mem_fraction_static=0.3)
    plain_cfg = LaunchConfig("/models/tiny", **sglang)
    spec_cfg = LaunchConfig("/models/tiny", "NEXTN", num_steps=3, topk=1, num_draft_tokens=4, **sglang)
    assert plain_cfg.sized_by_fraction() and spec_cfg.sized_by_fraction()
    stand_ins = {plain_cfg: standin_command("--plain", "--startup-delay", "3"), spec_cfg: standin_command()}
    real_start = room_module.start
    monkeypatch.setattr(room_module, "start", lambda cfg: real_start(stand_ins[cfg]))
    plain, spec = lab_servers(plain_cfg, spec_cfg, timeout=60, environ={}, report=lambda line: None)
    try:
        hz = os.sysconf("SC_CLK_TCK")
        assert (spec.ticks - plain.ticks) / hz >= 3, (plain.ticks, spec.ticks)  # after the plain one's 3 s
    finally:
        plain.stop(), spec.stop()
    assert gone([plain.pid, spec.pid]) == []


@pytest.mark.slow
def test_lab_3_runs_on_a_two_student_room_and_leaves_the_room_running(tmp_path, inline_plots):
    """The CI run of a class: `specdec room` as a script starts it (SIGINT ignored), student 1 pastes their line
    and runs the Lab 3 notebook (the solution, so that it scores), the room keeps serving, and Ctrl-C in the
    room's terminal stops it all. (SIGTERM is `specdec room --stop`'s, tested with the room of four; SIGHUP in
    test_launch_signals.py.)"""
    import nbformat
    from notebook_tools import execute, shrunk, text_of
    from test_notebooks_lab3 import SWEEP_LINE, SWEEP_SMALL

    room, csv_path, state_file = start_room(tmp_path, "--students", "2", "--algorithm", "none,NEXTN",
                                            "--port-base", "32300")
    try:
        out = []
        while not any(ln.startswith("all 4 servers ready") for ln in out):
            line = room.stdout.readline()
            assert line, "the room ended early:\n" + "".join(out)
            out.append(line)
        pasted = [ln.split(": ", 1)[1].strip() for ln in out if ln.strip().startswith("student-01: export ")]
        assert len(pasted) == 1, "".join(out)
        env = dict(item.split("=", 1) for item in pasted[0].removeprefix("export ").split())
        rows = {r["name"]: r for r in csv.DictReader(csv_path.open())}
        assert env == {ENV_URL: rows["student-01-plain"]["url"], ENV_SPEC_URL: rows["student-01-nextn"]["url"],
                       ENV_KEY: rows["student-01-plain"]["key"]}
        assert "%env SPECDEC_SPEC_URL=" in "".join(out)
        state = read_state(state_file)
        pids = sessions(state)

        mp = pytest.MonkeyPatch()
        for k, v in env.items():
            mp.setenv(k, v)  # as the student's shell would hand them to Jupyter's kernel
        try:
            # the solution's sweep made short: it runs at full size in test_notebooks_lab3; here the room is tested
            nb, seconds = execute(shrunk(nbformat.read(ROOT / "solutions" / "03_sglang_live.ipynb", as_version=4),
                                         {SWEEP_LINE: SWEEP_SMALL}), tmp_path,
                                  timeout=240)
        finally:
            mp.undo()
        text = text_of(nb)
        assert_solution_ran(nb, seconds)  # the solution's own test: full marks, the live parts measured
        assert f"using the room's servers at plain {env[ENV_URL]}, speculative {env[ENV_SPEC_URL]}" in text, text
        assert "started our own" not in text and "total: 16 / 16" in text
        assert "servers still running: none (of the 0 this notebook started)" in text
        assert all(pid_alive(p) for p in pids), "the notebook stopped a room's server"
        for r in rows.values():  # every student's servers still serve
            ok = requests.post(r["url"] + "/generate", json=GENERATE, headers={"Authorization": f"Bearer {r['key']}"},
                               timeout=60)
            assert ok.status_code == 200

        room.send_signal(signal.SIGINT)  # what Ctrl-C in the room's terminal sends it
        assert room.wait(timeout=60) == 0
        assert gone(pids + [room.pid]) == [] and not state_file.exists()
        assert "stopping the room" in room.stdout.read()
    finally:
        if room.poll() is None:
            room.kill()
            stop_room(state_file)
