"""One description of the machine a timing was taken on (specdec.serving.measure.machine), used by the zoo's
evaluation, the command line and the benchmarks."""

import os

from specdec.serving.measure import machine as m


def test_the_record_keeps_its_keys_in_order():
    rec = m.machine(3, torch="2.0")
    assert list(rec) == ["cpu", "threads", "torch", "python", "platform"]
    assert rec["threads"] == 3 and rec["cpu"] == m.cpu_name() and rec["cpu"]


def test_the_line_and_the_warning(monkeypatch):
    assert m.machine_line(2).startswith(f"{os.cpu_count()} cores, 2 thread(s), load average ")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert m.busy_warning() is None
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0 * (os.cpu_count() or 1), 0.0, 0.0))
    assert "busy" in m.busy_warning()


def test_the_command_line_and_the_zoo_use_it():
    from specdec.cli import common, decode, tour_lab2
    from specdec.zoo import evaluate

    assert not hasattr(common, "machine") and not hasattr(common, "busy_warning")
    assert decode.busy_warning is m.busy_warning and tour_lab2.machine_line is m.machine_line
    assert evaluate.machine is m.machine and not hasattr(evaluate, "_machine")
