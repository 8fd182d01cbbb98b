"""Compiling PTX for a chosen compute capability on a machine without a GPU.

``numba.cuda.compile_ptx(fn, sig, cc=cc)`` needs no driver, except that numba-cuda
compiles every ``@cuda.jit(device=True)`` function the kernel calls for the *current*
device (``get_current_device().compute_capability``), which initialises the driver.
:func:`for_cc` stands in a device description with the requested compute capability
for the duration of one compile, only when no CUDA driver is available (where nothing
can be launched, so the device functions compiled for ``cc`` are never run on another
device).  With a GPU present it changes nothing.  ``cc=None``: numba-cuda's default PTX
compute capability (typing a kernel that calls such functions, before any compile).
"""
from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

_LOCK = threading.RLock()


@contextlib.contextmanager
def for_cc(cc):
    from numba import cuda
    from numba.cuda import dispatcher

    if cuda.is_available():
        yield
        return
    if cc is None:
        from numba.cuda import config
        cc = config.CUDA_DEFAULT_PTX_CC
    with _LOCK:
        saved = dispatcher.get_current_device
        dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=tuple(cc))
        try:
            yield
        finally:
            dispatcher.get_current_device = saved
