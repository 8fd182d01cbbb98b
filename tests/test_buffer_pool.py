"""The pool of device buffers (kadj/buffer_pool.py) behind a tape's adjoint buffers.

The cases run in a subprocess (this file run as a script) with NUMBA_ENABLE_CUDASIM=1
set before numba is imported; with KADJ_BUFFER_POOL_GPU=1 on a machine with a CUDA
GPU they run on the GPU instead (scripts/gpu_check.sh).  Each case prints
"CASE <name> OK|FAIL <detail>".
"""
import os
import sys

import pytest

from cudatools import run_sim_cases

HERE = os.path.abspath(__file__)
CASES = ["second_backward_reuses", "reuse_across_tapes", "reused_buffers_are_zero",
         "limit_honoured"]
GPU = os.environ.get("KADJ_BUFFER_POOL_GPU") == "1"


def run_cases(cases, **env):
    return run_sim_cases(os.path.basename(HERE), cases, env, simulator=not GPU)


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.parametrize("name", CASES)
def test_buffer_pool(results, name):
    status, detail = results[name]
    assert status == "OK", detail


def test_limit_from_environment():
    status, detail = run_cases(["env_limit"], KADJ_BUFFER_POOL_BYTES="4096")["env_limit"]
    assert status == "OK", detail


# ---- the cases, run in the subprocess ------------------------------------------------
def _cases():
    global cuda, np           # module globals: the kernels' source refers to them
    import gc

    import numpy as np
    from numba import cuda

    import kadj
    from kadj import arrays, buffer_pool

    @kadj.differentiate
    @cuda.jit
    def step(u, v, alpha):
        i = cuda.grid(1)
        n = u.shape[0]
        if 0 < i < n - 1:
            v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.1 * u[i] * u[i]
        elif i == 0 or i == n - 1:
            v[i] = u[i]

    @kadj.differentiate
    @cuda.jit
    def loss_k(u, w, out):
        i = cuda.grid(1)
        if i < u.shape[0]:
            cuda.atomic.add(out, 0, u[i] * u[i] * w[i])

    n, steps = 16, 4
    rng = np.random.default_rng(1)
    u0, w0 = rng.random(n), rng.random(n)

    def forward_host(u, alpha=0.2):
        u = u.copy()
        for _ in range(steps):
            v = u.copy()
            v[1:-1] = u[1:-1] + alpha * (u[:-2] - 2 * u[1:-1] + u[2:]) + 0.1 * u[1:-1] ** 2
            u = v
        return float(np.sum(u * u * w0))

    def fd_grad(eps=1e-6):
        g = np.zeros(n)
        for k in range(n):
            e = np.zeros(n)
            e[k] = eps
            g[k] = (forward_host(u0 + e) - forward_host(u0 - e)) / (2 * eps)
        return g

    def record():
        u, v = cuda.to_device(u0), cuda.to_device(np.zeros(n))
        w, out = cuda.to_device(w0), cuda.to_device(np.zeros(1))
        start = u
        with kadj.Tape() as tape:
            for _ in range(steps):
                step[1, 32](u, v, 0.2)
                u, v = v, u
            loss_k[1, 32](u, w, out)
        return tape, start, out

    class Allocations:
        """Counts numba allocations and pool misses while active."""

        def __enter__(self):
            self.calls = 0
            self.saved = {}
            for name in ("device_array", "device_array_like", "to_device"):
                original = getattr(cuda, name)
                self.saved[name] = original

                def counting(*a, _original=original, **k):
                    self.calls += 1
                    return _original(*a, **k)
                setattr(cuda, name, counting)
            if not SIMULATED:
                ctx = cuda.current_context()
                self.ctx, self.memalloc = ctx, ctx.memalloc

                def memalloc(*a, **k):
                    self.calls += 1
                    return self.memalloc(*a, **k)
                ctx.memalloc = memalloc
            self.misses = buffer_pool.stats()["misses"]
            return self

        def __exit__(self, *exc):
            for name, original in self.saved.items():
                setattr(cuda, name, original)
            if not SIMULATED:
                del self.ctx.memalloc
            self.misses = buffer_pool.stats()["misses"] - self.misses

    fd = fd_grad()

    def check_fd(g, what):
        if not np.allclose(g, fd, rtol=1e-6, atol=1e-8):
            raise AssertionError(f"{what}: gradient {g} differs from finite "
                                 f"differences {fd}")

    def second_backward_reuses():
        tape, u_start, out = record()
        tape.backward(out)
        g1 = arrays.to_host(tape.grad(u_start))
        s1 = tape.scalar_grad("alpha")
        check_fd(g1, "first backward")
        tape.zero()
        gc.collect()
        with Allocations() as alloc:
            tape.backward(out)
        g2 = arrays.to_host(tape.grad(u_start))
        s2 = tape.scalar_grad("alpha")
        if alloc.calls or alloc.misses:
            return f"second backward allocated: {alloc.calls} allocations, " \
                   f"{alloc.misses} pool misses"
        if not np.array_equal(g1, g2) or s1 != s2:
            return f"gradients changed: {g1} vs {g2}, alpha {s1} vs {s2}"
        # the first backward did allocate: the counter can see allocations
        buffer_pool.clear()
        with Allocations() as alloc:
            tape.backward(out)
        if alloc.misses == 0:
            return "after clear() the backward took no new block"
        g3 = arrays.to_host(tape.grad(u_start))
        if not np.allclose(g3, 2 * g1, rtol=1e-12):
            return f"accumulated gradient {g3} is not twice {g1}"

    def reuse_across_tapes():
        tape, u_start, out = record()
        tape.backward(out)
        g1 = arrays.to_host(tape.grad(u_start))
        del tape
        gc.collect()
        tape, u_start, out = record()
        with Allocations() as alloc:
            tape.backward(out)
        if alloc.calls or alloc.misses:
            return f"a new tape's backward allocated: {alloc.calls} allocations, " \
                   f"{alloc.misses} pool misses"
        g2 = arrays.to_host(tape.grad(u_start))
        check_fd(g2, "second tape")
        if not np.array_equal(g1, g2):
            return f"gradients differ: {g1} vs {g2}"

    def reused_buffers_are_zero():
        buffer_pool.clear()
        streams = [None, cuda.stream()]
        for stream in streams:
            for dtype, shape in ((np.float64, (5, 3)), (np.float32, (30,))):
                a = buffer_pool.zeros(shape, dtype, stream)
                where = arrays.memory_key(a)[1]
                a.copy_to_device(np.full(shape, 7.5, dtype))
                del a
                gc.collect()
                before = buffer_pool.stats()["hits"]
                b = buffer_pool.zeros(shape, dtype, stream)
                if stream is not None:
                    stream.synchronize()
                if buffer_pool.stats()["hits"] != before + 1 or \
                        arrays.memory_key(b)[1] != where:
                    return f"the block of {shape} {dtype} was not reused"
                host = b.copy_to_host()
                if host.shape != shape or host.dtype != dtype or np.any(host != 0):
                    return f"a reused buffer is not zero: {host}"
                del b
                gc.collect()
        # 120 bytes: a float64 (15,) buffer takes the float32 (30,) block
        c = buffer_pool.zeros((15,), np.float64)
        if np.any(c.copy_to_host() != 0):
            return "a block reused for another dtype is not zero"

    def limit_honoured():
        buffer_pool.clear()
        buffer_pool.set_limit(1000)
        try:
            held = [buffer_pool.zeros((k,), np.float64) for k in (50, 40, 30, 20)]
            del held                                # 400 + 320 + 240 + 160 bytes
            gc.collect()
            kept = buffer_pool.stats()["kept_bytes"]
            if kept > 1000 or kept < 1000 - 400:
                return f"{kept} bytes kept with a limit of 1000"
            buffer_pool.set_limit(300)
            kept = buffer_pool.stats()["kept_bytes"]
            if kept > 300:
                return f"{kept} bytes kept after lowering the limit to 300"
            buffer_pool.set_limit(0)
            if buffer_pool.stats()["kept_bytes"] != 0:
                return "blocks kept with a limit of 0"
            x = buffer_pool.zeros((8,), np.float64)
            del x
            gc.collect()
            before = buffer_pool.stats()
            y = buffer_pool.zeros((8,), np.float64)
            after = buffer_pool.stats()
            if after["misses"] != before["misses"] + 1 or after["kept_bytes"]:
                return f"a limit of 0 still reuses blocks: {before} -> {after}"
            del y
            try:
                buffer_pool.set_limit(-1)
            except ValueError:
                pass
            else:
                return "a negative limit was accepted"
        finally:
            buffer_pool.set_limit(None)

    def env_limit():
        if buffer_pool.limit() != 4096:
            return f"limit {buffer_pool.limit()} instead of KADJ_BUFFER_POOL_BYTES=4096"
        held = [buffer_pool.zeros((256,), np.float64) for _ in range(3)]  # 2048 each
        del held
        gc.collect()
        kept = buffer_pool.stats()["kept_bytes"]
        if kept != 4096:
            return f"{kept} bytes kept with a limit of 4096 (expected two blocks)"

    return {f.__name__: f for f in (second_backward_reuses, reuse_across_tapes,
                                    reused_buffers_are_zero, limit_honoured,
                                    env_limit)}


SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if __name__ == "__main__":
    table = _cases()
    for case in sys.argv[1:]:
        try:
            problem = table[case]()
        except Exception as exc:          # reported, and the test fails
            problem = f"{type(exc).__name__}: {exc}"
        print(f"CASE {case} {'OK' if problem is None else 'FAIL'} {problem or ''}",
              flush=True)
