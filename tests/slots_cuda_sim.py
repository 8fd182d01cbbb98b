"""The gather form's slots (kadj.cuda.block_sum, kadj.cuda.slots) in the simulator (run
by tests/test_cuda_slots.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported; on a GPU with KADJ_ON_GPU=1 instead).  Prints ``CASE <name> OK <max error>`` or ``CASE <name> FAIL
<message>``.  The references are analytic: for ``v = u + a * lap(u)`` the gradient of
``sum(ct * v)`` with respect to ``a`` is ``sum(ct * lap(u))`` over the written
elements, and with respect to ``u`` the transposed stencil of ``ct``."""
import os
import sys

# (on a GPU too: tests/test_cuda_slots.py runs it without the simulator when one is present)
assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("KADJ_ON_GPU") == "1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402
from kadj.cuda import slots as slots_mod  # noqa: E402


@kadj.differentiate
@cuda.jit
def heat1d(u, v, a):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        v[i] = u[i] + a * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def heat2d_two(u, v, a, b):
    # two scalars, one float32: two rows of slots
    j, i = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        lap = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]
        v[i, j] = u[i, j] + a * lap + b * u[i, j] * u[i, j]


def _blocks(n, b):
    return (n + b - 1) // b


def _heat1d_reference(u, ct, a):
    lap = np.zeros_like(u)
    lap[1:-1] = u[:-2] - 2 * u[1:-1] + u[2:]
    g_a = float(np.sum(ct[1:-1] * lap[1:-1]))
    c = np.zeros_like(u)
    c[1:-1] = ct[1:-1]                   # the written elements' cotangents
    g_u = c.copy()
    g_u[:-1] += a * c[1:]
    g_u[1:] += a * c[:-1]
    g_u += -2.0 * a * c
    return g_u, g_a


def _run_heat1d(n, block, u, ct, a, k=heat1d):
    """(adj_u, adj_a, adj_v after) of one adjoint launch, fresh buffers."""
    adj_u = np.zeros(n)
    adj_v = ct.copy()
    adj_a = np.zeros(1)
    k.adjoint[_blocks(n, block), block](u, np.zeros(n), a, adj_u, adj_v, adj_a)
    return adj_u, adj_a[0], adj_v


def _check_heat1d(n, block, seed):
    rng = np.random.default_rng(seed)
    u, ct, a = rng.standard_normal(n), rng.standard_normal(n), 0.3
    assert heat1d.adjoint_report(u, np.zeros(n), a)["gather"]["used"]
    adj_u, adj_a, adj_v = _run_heat1d(n, block, u, ct, a)
    ref_u, ref_a = _heat1d_reference(u, ct, a)
    assert np.all(adj_v[1:-1] == 0.0), "the written elements' adjoints are not consumed"
    err_a = abs(adj_a - ref_a) / max(1.0, abs(ref_a))
    err_u = float(np.max(np.abs(adj_u - ref_u)))
    assert err_a < 1e-12 and err_u < 1e-12, (err_a, err_u)
    return max(err_a, err_u)


def many_blocks():
    # 150 blocks: more than the 128 slots, so blocks share slots
    return _check_heat1d(300, 2, 1)


def one_block():
    return _check_heat1d(30, 32, 2)


def repeated():
    """The consume kernel leaves the slots at zero: ten launches in a row each give
    the same scalar gradient, and accumulating into one buffer adds them."""
    rng = np.random.default_rng(3)
    n, block = 60, 4
    u, ct, a = rng.standard_normal(n), rng.standard_normal(n), 0.25
    _, ref_a = _heat1d_reference(u, ct, a)
    worst = 0.0
    for _ in range(10):
        _, got, _ = _run_heat1d(n, block, u, ct, a)
        worst = max(worst, abs(got - ref_a) / max(1.0, abs(ref_a)))
    acc = np.zeros(1)
    for _ in range(3):
        heat1d.adjoint[_blocks(n, block), block](u, np.zeros(n), a, np.zeros(n),
                                                 ct.copy(), acc)
    worst = max(worst, abs(acc[0] - 3 * ref_a) / max(1.0, abs(3 * ref_a)))
    assert worst < 1e-12, worst
    return worst


def two_rows_2d():
    """A 2-D grid of 168 blocks and two scalars (float64 and float32): two rows."""
    rng = np.random.default_rng(4)
    shape, block = (24, 27), (2, 2)
    u = rng.standard_normal(shape)
    ct = rng.standard_normal(shape)
    a, b = 0.2, np.float32(0.1)
    comp = heat2d_two.compiled(u, np.zeros(shape), a, b)
    assert comp.gather is not None and comp.gather.slot_rows == 2, comp.gather
    grid = (_blocks(shape[1], block[0]), _blocks(shape[0], block[1]))
    adj_u, adj_v = np.zeros(shape), ct.copy()
    adj_a, adj_b = np.zeros(1), np.zeros(1, np.float32)
    heat2d_two.adjoint[grid, block](u, np.zeros(shape), a, b, adj_u, adj_v, adj_a, adj_b)
    lap = np.zeros(shape)
    lap[1:-1, 1:-1] = (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:]
                       - 4.0 * u[1:-1, 1:-1])
    inner = (slice(1, -1), slice(1, -1))
    ref_a = float(np.sum(ct[inner] * lap[inner]))
    ref_b = float(np.sum(ct[inner] * u[inner] ** 2))
    err_a = abs(adj_a[0] - ref_a) / max(1.0, abs(ref_a))
    err_b = abs(float(adj_b[0]) - ref_b) / max(1.0, abs(ref_b))
    assert err_a < 1e-12, err_a
    assert err_b < 1e-5, err_b     # float32 buffer
    assert np.all(adj_v[inner] == 0.0)
    return max(err_a, err_b)


def failed_launch_drops_slots():
    """A launch that fails after the gather kernel (before the consume kernel) leaves
    sums in its slots: the array is dropped, and the next launch is right."""
    rng = np.random.default_rng(6)
    n, block = 40, 4
    u, ct, a = rng.standard_normal(n), rng.standard_normal(n), 0.3
    comp = heat1d.compiled(u, np.zeros(n), a)
    g = comp.gather
    config = (_blocks(n, block), block)

    class Fails:
        def __getitem__(self, config):
            def launch(*args):
                raise RuntimeError("launch failed")
            return launch

    args = (u, np.zeros(n), a, np.zeros(n), ct.copy(), np.zeros(1))
    before = len(slots_mod._arrays)
    try:
        slots_mod.launch((g.kernels[0], Fails()), config, args, g.slot_rows)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failing launch did not raise")
    assert len(slots_mod._arrays) == max(0, before - 1) or \
        slots_mod._key(config, g.slot_rows) not in slots_mod._arrays
    _, got, _ = _run_heat1d(n, block, u, ct, a)
    _, ref_a = _heat1d_reference(u, ct, a)
    err = abs(got - ref_a) / max(1.0, abs(ref_a))
    assert err < 1e-12, err
    return err


def streams():
    """Launches on another stream use another slots array, and are right."""
    rng = np.random.default_rng(7)
    n, block = 40, 4
    u, ct, a = rng.standard_normal(n), rng.standard_normal(n), 0.3
    s = cuda.stream()
    adj_a = np.zeros(1)
    heat1d.adjoint[_blocks(n, block), block, s](u, np.zeros(n), a, np.zeros(n),
                                                ct.copy(), adj_a)
    s.synchronize()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        # (the simulator runs each launch at once: one array serves all its streams)
        keys = [k for k, (_, kept) in slots_mod._arrays.items() if kept is s]
        assert len(keys) == 1, list(slots_mod._arrays)
    # the default stream: one array however its stream object is spelled
    before = len(slots_mod._arrays)
    for stream in (0, cuda.default_stream(), cuda.default_stream()):
        heat1d.adjoint[_blocks(n, block), block, stream](u, np.zeros(n), a, np.zeros(n),
                                                         ct.copy(), np.zeros(1))
    assert len(slots_mod._arrays) <= before + 1, list(slots_mod._arrays)
    _, ref_a = _heat1d_reference(u, ct, a)
    err = abs(adj_a[0] - ref_a) / max(1.0, abs(ref_a))
    assert err < 1e-12, err
    return err


CASES = {"many_blocks": many_blocks, "one_block": one_block, "repeated": repeated,
         "two_rows_2d": two_rows_2d, "failed_launch_drops_slots": failed_launch_drops_slots,
         "streams": streams}


if __name__ == "__main__":
    report_cases(CASES, sys.argv[1:])
