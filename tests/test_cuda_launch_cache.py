"""Repeated CUDA adjoint launches take the cheap checks (kadj/cuda/call_facts.py), and
every launch the full checks would refuse is still refused.

The launches run in the CUDA simulator: this file runs itself as a script in a
subprocess with ``NUMBA_ENABLE_CUDASIM=1`` and prints one line per case.
"""
import os
import subprocess
import sys

import pytest
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = ("repeat_takes_the_cheap_checks", "aliased_buffer_refused", "shape_change_refused",
         "overlapping_views_refused", "duplicated_launch_dims_refused",
         "read_only_host_buffer_refused", "host_arrays_repeat")


@cuda.jit
def heat_launch(u, v, c):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        v[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def _sim_cases():
    import numpy as np

    import kadj
    from kadj import validate

    heat = heat_launch
    n = 64
    rng = np.random.default_rng(3)
    u_h = rng.random(n)
    w = rng.random(n)
    full = {"n": 0}
    orig = validate.check_adjoint_call

    def counted(*a, **k):
        full["n"] += 1
        return orig(*a, **k)

    validate.check_adjoint_call = counted

    def expected(c=0.3):
        adj_u = np.zeros(n)
        adj_c = 0.0
        for i in range(1, n - 1):
            adj_u[i - 1] += c * w[i]
            adj_u[i] += (1 - 2 * c) * w[i]
            adj_u[i + 1] += c * w[i]
            adj_c += w[i] * (u_h[i - 1] - 2 * u_h[i] + u_h[i + 1])
        return adj_u, adj_c

    def launch(k, cfg, u, v, au, av, ac, c=0.3):
        k.adjoint[cfg](u, v, c, au, av, ac)

    def dev_args():
        return (cuda.to_device(u_h), cuda.to_device(np.zeros(n)),
                cuda.to_device(np.zeros(n)), cuda.to_device(w.copy()),
                cuda.to_device(np.zeros(1)))

    def refused(fn, phrase):
        try:
            fn()
        except ValueError as exc:
            assert phrase in str(exc), str(exc)
            return
        raise AssertionError(f"not refused ({phrase})")

    cfg = (2, 32)

    def repeat_takes_the_cheap_checks():
        k = kadj.differentiate(heat)
        want_u, want_c = expected()
        for rnd in range(3):
            u, v, au, av, ac = dev_args()
            before = full["n"]
            launch(k, cfg, u, v, au, av, ac)
            np.testing.assert_allclose(au.copy_to_host(), want_u, rtol=1e-12)
            np.testing.assert_allclose(ac.copy_to_host()[0], want_c, rtol=1e-12)
            assert (full["n"] - before) == (1 if rnd == 0 else 0), (rnd, full["n"] - before)

    def aliased_buffer_refused():
        k = kadj.differentiate(heat)
        u, v, au, av, ac = dev_args()
        launch(k, cfg, u, v, au, av, ac)
        refused(lambda: launch(k, cfg, u, v, u, av, ac), "shares memory")

    def shape_change_refused():
        k = kadj.differentiate(heat)
        u, v, au, av, ac = dev_args()
        launch(k, cfg, u, v, au, av, ac)
        refused(lambda: launch(k, cfg, u, v, cuda.to_device(np.zeros(n - 1)), av, ac),
                "shape")

    def overlapping_views_refused():
        k = kadj.differentiate(heat)
        u, v, au, av, ac = dev_args()
        launch(k, cfg, u, v, au, av, ac)
        big = cuda.to_device(np.zeros(n + 8))
        refused(lambda: launch(k, cfg, u, v, big[:n], big[8:], ac), "share memory")

    def duplicated_launch_dims_refused():
        k = kadj.differentiate(heat)
        u, v, au, av, ac = dev_args()
        launch(k, cfg, u, v, au, av, ac)
        try:
            launch(k, ((2,), (32, 2)), u, v, au, av, ac)
        except kadj.DifferentiationError as exc:
            assert "the kernel reads only threadIdx.x" in str(exc), str(exc)
            return
        raise AssertionError("a launch with duplicated threads was not refused")

    def read_only_host_buffer_refused():
        k = kadj.differentiate(heat)
        args = [u_h.copy(), np.zeros(n), np.zeros(n), w.copy(), np.zeros(1)]
        launch(k, cfg, *args)
        ro = np.zeros(n)
        ro.flags.writeable = False
        refused(lambda: launch(k, cfg, args[0], args[1], ro, w.copy(), np.zeros(1)),
                "writeable")

    def host_arrays_repeat():
        k = kadj.differentiate(heat)
        want_u, _ = expected()
        for _ in range(2):
            au = np.zeros(n)
            launch(k, cfg, u_h.copy(), np.zeros(n), au, w.copy(), np.zeros(1))
            np.testing.assert_allclose(au, want_u, rtol=1e-12)
        refused(lambda: launch(k, cfg, u_h.copy(), np.zeros(n), np.zeros(n), w.copy(),
                               np.zeros(2)), "1-element")

    found = locals()
    return {name: found[name] for name in CASES}


@pytest.fixture(scope="module")
def sim_results():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=HERE)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, *rest = line.split(" ", 3)
            out[name] = (status, rest[0] if rest else "")
    return out, proc


@pytest.mark.parametrize("name", CASES)
def test_in_simulator(sim_results, name):
    out, proc = sim_results
    assert name in out, f"no result for {name}\n{proc.stdout}\n{proc.stderr}"
    status, detail = out[name]
    assert status == "ok", detail


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    sys.path.insert(0, os.path.dirname(HERE))
    import traceback
    for case_name, fn in _sim_cases().items():
        try:
            fn()
            print(f"CASE {case_name} ok")
        except Exception:
            msg = traceback.format_exc().replace("\n", " | ")
            print(f"CASE {case_name} fail {msg}")
        sys.stdout.flush()
