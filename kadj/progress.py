"""A one-line message when generating or compiling an adjoint takes a while.

Generating an adjoint is quick, but numba may take tens of seconds to compile the
adjoint of a long kernel; without a word the program looks hung.  :func:`notice` runs
its block and, only when the block is still running after ``KADJ_PROGRESS_AFTER``
seconds (default 3; ``off`` never), writes ``kadj: compiling the adjoint of heat_step
(model.py:12) ...`` to standard error, completed by the time taken when the block ends.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

_DEFAULT_AFTER = 3.0


def _after():
    raw = os.environ.get("KADJ_PROGRESS_AFTER", "").strip().lower()
    if raw in ("off", "never", "none"):
        return None
    try:
        return max(0.0, float(raw)) if raw else _DEFAULT_AFTER
    except ValueError:
        return _DEFAULT_AFTER


def where(fn):
    """``name (file.py:line)`` of a Python function or a numba dispatcher."""
    fn = getattr(fn, "py_func", fn)
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__name__", "kernel")
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


@contextlib.contextmanager
def notice(what, stream=None):
    """Run the block; say ``kadj: <what> ...`` if it is still running after the
    threshold, and how long it took when it ends."""
    after = _after()
    if after is None:
        yield
        return
    out = stream if stream is not None else sys.stderr
    said = threading.Event()
    lock = threading.Lock()
    done = [False]

    def say():
        with lock:
            if done[0]:
                return
            said.set()
            try:
                out.write(f"kadj: {what} ...")
                out.flush()
            except (OSError, ValueError):
                pass

    start = time.perf_counter()
    timer = threading.Timer(after, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            done[0] = True
        if said.is_set():
            try:
                out.write(f" {time.perf_counter() - start:.1f} s\n")
                out.flush()
            except (OSError, ValueError):
                pass
