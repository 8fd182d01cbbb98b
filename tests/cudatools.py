"""What the CUDA tests need to know about this machine."""


def nvvm_available():
    """(True, "") when numba-cuda can compile PTX here (NVVM present, simulator off),
    else (False, reason)."""
    try:
        from numba import cuda
        from numba.cuda.core import config
        if config.ENABLE_CUDASIM:
            return False, "NUMBA_ENABLE_CUDASIM is set"

        def probe(x):
            x[0] = 1.0
        cuda.compile_ptx(probe, "void(float64[::1])", cc=(9, 0))
        return True, ""
    except Exception as exc:  # NVVM/NVRTC missing
        return False, f"numba-cuda cannot compile PTX here: {exc}"
