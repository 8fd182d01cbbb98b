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


def run_sim_cases(script, cases, env=None, simulator=True):
    """Run ``script`` (a file in tests/) with ``cases`` as arguments in a subprocess with
    NUMBA_ENABLE_CUDASIM=1 set before numba is imported (unset instead when not
    ``simulator``: on a GPU), and the variables of ``env`` added; {case: (status,
    detail)} from its ``CASE name status [detail]`` lines.  Fails the test when a case
    reports nothing."""
    import os
    import subprocess
    import sys

    import pytest

    here = os.path.dirname(os.path.abspath(__file__))
    full = dict(os.environ, **(env or {}))
    if simulator:
        full["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        full.pop("NUMBA_ENABLE_CUDASIM", None)
    full["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here),
                                          full.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(here, script), *cases],
                          env=full, capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = (line + " ").split(" ", 3)
            out[name] = (status, rest.strip())
    missing = [c for c in cases if c not in out]
    if not out or missing:
        pytest.fail(f"subprocess did not report {missing or 'any case'}:\n"
                    f"{proc.stdout}\n{proc.stderr}")
    return out


def report_cases(cases, names):
    """In a case script: run ``cases`` ({name: function returning an error size}) named
    in ``names`` (all when empty), printing ``CASE name OK err`` or ``CASE name FAIL
    message`` per case, the lines :func:`run_sim_cases` reads."""
    for name in names or cases:
        try:
            err = cases[name]()
            print(f"CASE {name} OK {err:.3e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


def adjoint_keeps_arguments(k, config, args, seed=3):
    """In a case script: ``k.adjoint[config](*args, *buffers)`` changes the gradient
    buffers only (random cotangents, one per adjoint slot): the user's arrays keep
    their values, and some buffer changes.  Returns 0.0 (an error size)."""
    import numpy as np
    plan = k.adjoint_plan(*args)
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    r = np.random.default_rng(seed)
    adjs = [r.standard_normal(np.shape(args[i])).astype(np.asarray(args[i]).dtype)
            if isinstance(args[i], np.ndarray) else np.zeros(1, np.asarray(args[i]).dtype)
            for i in plan.adjoint_args]
    adjs_before = [a.copy() for a in adjs]
    k.adjoint[config](*args, *adjs)
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), "an argument array changed"
    assert any(not np.array_equal(a, b) for a, b in zip(adjs, adjs_before)), \
        "no gradient buffer changed"
    return 0.0


def launched_on_copies(k, config, args):
    """In a case script: the arguments after ``k[config]`` ran on copies of them."""
    import numpy as np
    args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    k[config](*args)
    return args

