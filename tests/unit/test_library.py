"""library.py without llama.cpp: signals_held, which keeps a Ctrl-C that arrives during a long llama.cpp
call from being lost in the log callback. libc's qsort stands in for llama.cpp: a C call that calls
Python back while the signal is pending."""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from ssd_edge.cli.signals import Terminated, terminate_as_interrupt
from ssd_edge.llama.library import signals_held

libc = ctypes.CDLL(None)
COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def c_call_with_callbacks(signum: int) -> int:
    """qsort with a comparator that sends `signum` to this process on its first call (as a terminal would
    while llama.cpp loads) and is called again after: Python runs the handler inside a callback."""
    calls = [0]

    def compare(a: int, b: int) -> int:
        calls[0] += 1
        if calls[0] == 1:
            libc.kill(os.getpid(), signum)
        return 0
    values = (ctypes.c_int * 8)(*range(8))
    libc.qsort(values, 8, ctypes.sizeof(ctypes.c_int), COMPARE(compare))
    return calls[0]


def test_a_ctrl_c_during_a_c_call_is_raised_when_it_returns():
    # Python's own handler, as in a terminal: a process started in the background by a shell (as CI may
    # run the suite) inherits SIGINT ignored, and an ignored signal is rightly ignored after the call too
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_held():
                assert c_call_with_callbacks(signal.SIGINT) > 1  # the C call ran to its end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_ctrl_c_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with signals_held():
            assert c_call_with_callbacks(signal.SIGINT) > 1
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigterm_reaches_the_handler_in_place_after_the_call():
    with terminate_as_interrupt():
        with pytest.raises(Terminated):
            with signals_held():
                c_call_with_callbacks(signal.SIGTERM)


def test_no_signal_no_exception():
    with signals_held():
        assert c_call_with_callbacks(0) > 1  # signal 0: kill only checks the process exists
