"""Counting device-to-host copies and host synchronisations in the CUDA simulator, and
running the tape's device checks there as on a GPU; for the simulator scripts
tests/tape_sim_cases.py and tests/fingerprint_device_sim.py (run with
NUMBA_ENABLE_CUDASIM=1)."""
import warnings
from contextlib import contextmanager

from numba import cuda
from numba.cuda.simulator import api as sim_api
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from kadj import device_ops, tape_checks

# the simulator runs the uint64 hash on NumPy scalars, which warn on (intended) wrapping
warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)


class Counters:
    """Counts ``copy_to_host`` calls of device arrays and synchronisations (of the
    device, of a stream, of an event) while active."""

    def __enter__(self):
        self.copies = self.syncs = 0
        self.saved = (FakeCUDAArray.copy_to_host, cuda.synchronize,
                      sim_api.stream.synchronize, sim_api.Event.synchronize)
        host, sync, ssync, esync = self.saved

        def copy_to_host(arr, *a, **k):
            self.copies += 1
            return host(arr, *a, **k)

        def synchronize():
            self.syncs += 1
            return sync()

        def stream_sync(s):
            self.syncs += 1
            return ssync(s)

        def event_sync(e):
            self.syncs += 1
            return esync(e)
        FakeCUDAArray.copy_to_host = copy_to_host
        cuda.synchronize = synchronize
        sim_api.stream.synchronize = stream_sync
        sim_api.Event.synchronize = event_sync
        return self

    def __exit__(self, *exc):
        (FakeCUDAArray.copy_to_host, cuda.synchronize, sim_api.stream.synchronize,
         sim_api.Event.synchronize) = self.saved


@contextmanager
def device_checks():
    """The tape fingerprints simulator arrays with the device kernels (as it does device
    arrays on a GPU), run with 8 threads a block (each simulated thread is a Python
    thread)."""
    saved = tape_checks.SIMULATOR_ON_DEVICE, device_ops.THREADS
    tape_checks.SIMULATOR_ON_DEVICE, device_ops.THREADS = True, 8
    try:
        yield
    finally:
        tape_checks.SIMULATOR_ON_DEVICE, device_ops.THREADS = saved


@contextmanager
def pending_events():
    """Events that report their work as not completed yet (``query()`` False), as on a
    GPU right after work is enqueued; the simulator's events have no ``query``."""
    sim_api.Event.query = lambda self: False
    try:
        yield
    finally:
        del sim_api.Event.query
