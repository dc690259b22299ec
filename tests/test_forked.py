"""castore.forked: work in a forked child, its answer back through a pipe, what the parent sends
it through another; a child that raises answers None, one that dies raises WorkerDied, one left
before its answer (or stopped) is killed, and so is one whose parent dies (Linux). Each test
forks from a process of its own (a pytest process may run threads: no fork there)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from castore.forked import can_fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def _in_process(body: str) -> str:
    got = subprocess.run([sys.executable, "-c", "import os, signal, time\nfrom castore.forked import *\n" + body],
                         capture_output=True, text=True, check=False, timeout=120)
    assert got.returncode == 0, got.stderr
    return got.stdout.strip()


def test_the_answer_comes_back_whole() -> None:
    assert _in_process("with Forked(lambda receive: b'x' * 5_000_000 + b'end') as f:\n"
                       "    a = f.answer()\n"
                       "print(len(a), a[-3:].decode())") == "5000003 end"


def test_a_worker_that_raises_answers_none() -> None:
    assert _in_process("def work(receive):\n    raise OSError('disk')\n"
                       "with Forked(work) as f:\n    print(f.answer())") == "None"


def test_a_worker_that_dies_raises_worker_died() -> None:
    out = _in_process("def work(receive):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "try:\n    Forked(work).answer()\nexcept WorkerDied as e:\n"
                      "    print(type(e).__mro__[1].__name__, '|', e)")
    assert out.startswith("CastoreError | a worker process") and "signal 9" in out


def test_leaving_before_the_answer_kills_the_worker() -> None:
    out = _in_process("def work(receive):\n    time.sleep(600)\n    return b''\n"
                      "try:\n    with Forked(work) as f:\n        pid = f._pid\n        raise KeyError\n"
                      "except KeyError:\n    pass\n"
                      "try:\n    os.kill(pid, 0)\nexcept ProcessLookupError:\n    print('gone')")
    assert out == "gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel kills the child on Linux only")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_worker_whose_parent_dies_is_killed_with_it(sig: str) -> None:
    # the worker tells the parent it runs, the parent dies; a worker that ran on would write
    # "orphan" to the output they share once its sleep ends (and hold it open until then)
    body = ("r, w = os.pipe()\n"
            "def work(receive):\n    os.write(w, b'x')\n    time.sleep(30)\n    os.write(1, b'orphan\\n')\n"
            "    return b''\n"
            "f = Forked(work)\nos.read(r, 1)\n"
            f"print(f._pid, flush=True)\nos.kill(os.getpid(), signal.{sig})\n")
    got = subprocess.run([sys.executable, "-c", "import os, signal, time\nfrom castore.forked import *\n" + body],
                         capture_output=True, text=True, check=False)
    assert got.returncode == -getattr(signal, sig), got.stderr
    assert got.stdout.split() == [got.stdout.split()[0]]  # the worker's pid, and no "orphan"


def test_what_the_parent_sends_reaches_the_child_while_the_parent_goes_on() -> None:
    # 5 MB: more than a pipe holds; the child reads them only after a while, the parent sends
    # without waiting for it
    out = _in_process("def work(receive):\n    time.sleep(0.2)\n    got = receive()\n    return got[-3:] + b'%d' % len(got)\n"
                      "with Forked(work) as f:\n    t = time.monotonic()\n    f.send(b'y' * 5_000_000 + b'end')\n"
                      "    sent = time.monotonic() - t\n    a = f.answer()\n"
                      "print(a.decode(), sent < 0.2)")
    assert out == "end5000003 True"


def test_a_child_stopped_while_it_waits_for_what_is_sent_is_killed() -> None:
    out = _in_process("def work(receive):\n    return receive()\n"
                      "f = Forked(work)\npid = f._pid\nf.stop()\nf.stop()\n"
                      "try:\n    os.kill(pid, 0)\nexcept ProcessLookupError:\n    print('gone')")
    assert out == "gone"


def test_a_child_that_dies_before_it_reads_what_is_sent_raises_worker_died() -> None:
    out = _in_process("def work(receive):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "with Forked(work) as f:\n    f.send(b'z' * 5_000_000)\n"
                      "    try:\n        f.answer()\n    except WorkerDied as e:\n        print('died', 'signal 9' in str(e))")
    assert out == "died True"


def test_no_fork_while_another_thread_runs_or_on_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import castore.forked as forked

    monkeypatch.setattr(forked, "cores", lambda: 2)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()  # a pool or an I/O thread here would not be there in the child
    finally:
        stop.set()
        t.join()
    monkeypatch.setattr(forked, "cores", lambda: 1)
    assert not can_fork()
    assert _in_process("print(can_fork() == (cores() >= 2))") == "True"
