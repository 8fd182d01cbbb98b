"""Changes made to recorded arrays outside recorded launches are detected: backward
raises a DifferentiationError naming the array instead of returning a wrong gradient."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError
from kadj.fingerprint import fingerprint

N = 10


@kadj.differentiate
@numba.njit
def heat(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    v[0] = u[0]
    v[u.shape[0] - 1] = u[u.shape[0] - 1]


@kadj.differentiate
@numba.njit
def sqsum(u, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * u[i]
    out[0] = s


def sequence(change):
    """heat(u0 -> u1); change(u1) in Python; heat(u1 -> u2); loss."""
    u0 = np.linspace(1.0, 2.0, N) ** 2
    u1, u2, out = np.zeros(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as tape:
        heat(u0, u1, 0.2)
        change(u1, u0)
        heat(u1, u2, 0.2)
        sqsum(u2, out)
    return tape, out, u0


def test_unchanged_sequence_passes():
    tape, out, u0 = sequence(lambda u1, u0: None)
    tape.backward(out)
    assert np.abs(tape.grad(u0)).max() > 0


@pytest.mark.parametrize("change", [
    lambda u1, u0: u1.__setitem__(0, 0.0),                   # one element
    lambda u1, u0: u1.__setitem__(N - 1, u1[N - 1] * 2),
    lambda u1, u0: u1.__setitem__(slice(None), u1[::-1].copy()),   # a permutation
])
def test_change_between_launches_is_named(change):
    tape, out, _ = sequence(change)
    with pytest.raises(DifferentiationError) as info:
        tape.backward(out)
    msg = str(info.value)
    assert "'v' of launch #0 (kernel 'heat')" in msg
    assert "detected at launch #1" in msg
    assert "record_custom" in msg and "copy" in msg


def test_change_after_the_last_launch_is_detected():
    tape, out, u0 = sequence(lambda u1, u0: None)
    u0[3] += 1e-3                       # read by launch #0, changed afterwards
    with pytest.raises(DifferentiationError,
                       match=r"'u' of launch #0 .*after the last recorded launch"):
        tape.backward(out)


def test_change_to_an_array_only_read_is_detected():
    u0, u1, out = np.ones(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as tape:
        heat(u0, u1, 0.2)
        u0[5] = 7.0                    # the adjoint of launch #0 would read this
        sqsum(u1, out)
    with pytest.raises(DifferentiationError, match="'u' of launch #0"):
        tape.backward(out)


def test_check_can_be_turned_off():
    u0 = np.linspace(0.0, 1.0, N)
    u1, u2, out = np.zeros(N), np.zeros(N), np.zeros(1)
    with kadj.Tape(check_unrecorded_changes=False) as tape:
        heat(u0, u1, 0.2)
        u1[0] = 0.0
        heat(u1, u2, 0.2)
        sqsum(u2, out)
    tape.backward(out)                  # the documented identity treatment
    assert tape.grad(u0).shape == (N,)


def test_nested_tapes_both_detect():
    u0, u1, out = np.ones(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as outer:
        with kadj.Tape() as inner:
            heat(u0, u1, 0.2)
            u1[2] = 3.0
            sqsum(u1, out)
    for tape in (outer, inner):
        with pytest.raises(DifferentiationError, match="'v' of launch #0"):
            tape.backward(out)


def test_large_array_single_element_changes_are_caught():
    a = np.random.default_rng(1).random(20_000)           # above the bytes shortcut
    f0 = fingerprint(a)
    for k in (0, 1, 7, 9_999, 19_999):
        b = a.copy()
        b[k] = np.nextafter(b[k], 2.0)                    # the smallest change
        assert fingerprint(b) != f0
    b = a.copy()
    b[[10, 11]] = b[[11, 10]]
    assert fingerprint(b) != f0
    assert fingerprint(a.copy()) == f0
    c = np.arange(9, dtype=np.int8).repeat(1001)           # a byte tail, small dtype
    d = c.copy()
    d[-1] += 1
    assert fingerprint(c) != fingerprint(d)
    assert fingerprint(a[::3]) == fingerprint(a[::3].copy())


def test_simulator_arrays_are_fingerprinted_through_their_host_array():
    class SimulatorLike:            # the CUDA simulator's arrays wrap a NumPy array
        def __init__(self, ary):
            self._ary = ary

    a = SimulatorLike(np.arange(6.0))
    f0 = fingerprint(a)
    a._ary[4] = -1.0
    assert f0 is not None and fingerprint(a) != f0
    assert fingerprint(object()) is None
