"""A KeyboardInterrupt that arrives inside ``gc_paused``'s enter or exit leaves the pause
count right: the collector is back on once the last pause ends, and stays off while another
goes on.

CPython runs a signal handler (Ctrl-C's KeyboardInterrupt) where it checks for one: as a
function starts and right after each call returns. The interrupt is made at each such point
of the module's code in turn, by an opcode trace function that raises it there (a trace
function's exception is raised in the traced frame, at that instruction, and the trace is
then off: one interrupt, as from one Ctrl-C)."""

from __future__ import annotations

import dis
import gc
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from castore import gcpause
from castore.gcpause import gc_paused


def _interrupt_at(n: int) -> Callable[[FrameType, str, Any], Any]:
    """A trace function that raises KeyboardInterrupt at the ``n``-th point (0-based) where
    CPython may run a signal handler in castore/gcpause.py's code: a function's first
    instruction, and the one after each call."""
    seen = [0]
    last: dict[int, str] = {}  # frame -> the instruction it ran last

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != gcpause.__file__:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
            checks = op == "RESUME" or last.get(id(frame), "").startswith("CALL")
            last[id(frame)] = op
            if checks:
                seen[0] += 1
                if seen[0] - 1 == n:
                    raise KeyboardInterrupt
        return trace

    return trace


def _run(step: str, n: int, outer: bool) -> bool:
    """Enter and leave a pause (inside another when ``outer``), interrupted at instruction
    ``n`` of ``step`` (``enter`` or ``exit``); whether the interrupt came."""
    tracer = _interrupt_at(n)
    interrupted = False
    p = gc_paused()
    try:
        if step == "enter":
            sys.settrace(tracer)
            try:
                p.__enter__()
            finally:
                sys.settrace(None)
            p.__exit__(None, None, None)  # (not reached when the interrupt came in enter)
        else:
            p.__enter__()
            sys.settrace(tracer)
            try:
                p.__exit__(None, None, None)
            finally:
                sys.settrace(None)
    except KeyboardInterrupt:
        interrupted = True
    return interrupted


@pytest.mark.parametrize("outer", [False, True], ids=["alone", "inside-another"])
@pytest.mark.parametrize("step", ["enter", "exit"])
def test_an_interrupt_inside_enter_or_exit_leaves_the_count_right(step: str, outer: bool) -> None:
    # from a collector on and no pause going (a test before may have run `castore usage`,
    # which switches the collector off for its process); as it was again afterwards
    was, going = gc.isenabled(), dict(gcpause._pauses)
    gcpause._pauses.clear()
    gc.enable()
    n = 0
    try:
        while True:
            held = gc_paused()
            if outer:
                held.__enter__()
            try:
                came = _run(step, n, outer)
                # the pause interrupted is over: only the outer one (if any) is counted
                assert len(gcpause._pauses) == (1 if outer else 0), (step, n)
                assert gc.isenabled() is (not outer), (step, n)
            finally:
                if outer:
                    held.__exit__(None, None, None)
            assert not gcpause._pauses and gc.isenabled(), (step, n)
            if not came:
                break  # past the last instruction: every one was tried
            n += 1
    finally:
        gcpause._pauses.clear()
        gcpause._pauses.update(going)
        (gc.enable if was else gc.disable)()
    assert n >= 4  # the trace saw the code it interrupts (its start, and after each call)
