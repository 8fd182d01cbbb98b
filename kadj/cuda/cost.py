"""The GPU parts of a CUDA kernel's cost card (:mod:`kadj.cost_card`): whether a GPU is
here, and timing the forward and the adjoint launches on it with device arrays."""
from __future__ import annotations

import numpy as np


def gpu_present():
    """Whether a CUDA GPU runs kernels here (the simulator does not count)."""
    from .frontend import simulator_enabled
    if simulator_enabled():
        return False
    try:
        from numba import cuda
        return bool(cuda.is_available())
    except Exception:
        return False


def adjoint_launcher(kernel, args, buffers, config):
    """A function that launches ``kernel``'s adjoint once on device copies of ``args``
    and ``buffers`` and waits for it (an adjoint only adds into its input adjoints, so
    repeated launches cost the same)."""
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    bufs = [cuda.to_device(b) for b in buffers]

    def launch():
        kernel.adjoint[config](*dev, *bufs)
        cuda.synchronize()
    return launch


def forward_launcher(kernel, args, config):
    """A function that launches ``kernel``'s forward once on device copies of ``args``
    and waits for it."""
    from numba import cuda
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]

    def launch():
        kernel.forward(config, *dev)
        cuda.synchronize()
    return launch
