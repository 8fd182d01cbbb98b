"""Cheap arithmetic of a value an iteration records anyway is recomputed in reverse
instead of recorded (kadj/analysis/recompute.py, ``wanted``): gradients against float64
finite differences, and the values recorded per iteration counted in the facts and in
the generated adjoint."""
import math

import numba
import numpy as np
import pytest
from numba import njit

import kadj
from kadj import ir, pipeline
from kadj.targets import cpu
from kadj.testing import check_grad

rng = np.random.default_rng(21)


@njit
def cubic_in_place(u, k, dt, steps):
    # v is overwritten in u; v * v and v - v * v * v are cheap arithmetic of v
    for t in range(steps):
        for i in range(u.shape[0]):
            v = u[i]
            u[i] = v + dt * k[i] * (v - v * v * v)


@njit
def two_recorded(u, w, steps):
    # a * b needs two recorded values: recording it costs one value, recomputing it two
    # (in a time loop: a step reads what the step before stored, which is recorded)
    for t in range(steps):
        for i in range(u.shape[0]):
            a = u[i]
            b = w[i]
            u[i] = 0.5 * a
            w[i] = 0.25 * b
            c = a * b
            u[i] = u[i] + c * c


@njit
def transcendental(u, steps):
    # sin(v) is not recomputed from v (recording its value is cheaper)
    for t in range(steps):
        for i in range(u.shape[0]):
            v = u[i]
            s = math.sin(v)
            u[i] = s * s + v


@njit
def skipped_iterations(u, k, steps):
    # what follows a continue is the else arm of its if: a value assigned there is not
    # one each reversed iteration holds at its top, and q stays recorded
    for t in range(steps):
        for i in range(u.shape[0]):
            if k[i] < 0.0:
                continue
            v = u[i]
            q = v * k[i] + 1.0
            u[i] = q * q - v
            k[i] = q * 0.5


def _facts(fn, *args):
    arg_types = tuple(numba.typeof(x) for x in args)
    out = pipeline.stages(cpu.CPU, kadj.differentiate(fn), arg_types, until="facts")
    return out["prepared"].kernel, out["facts"]


def _user_names(kernel, names):
    """The recorded variables as the source names them (temporaries excluded)."""
    return {n for n in names if not n.startswith(("$", "_"))}


@pytest.mark.parametrize("n, steps", [(1, 1), (5, 3), (300, 4)])
def test_cubic_update_records_only_the_overwritten_value(n, steps):
    args = (rng.uniform(-0.9, 0.9, n), 0.5 + rng.random(n), 0.1, steps)
    k = kadj.differentiate(cubic_in_place)
    check_grad(k, args)
    kernel, f = _facts(cubic_in_place, *args)
    assert f.pushed == {"v"}
    # one value per iteration: the tape holds n * steps entries
    assert "_kept_array(_keep_bytes, max(0, " in k.adjoint_source(*args)


def test_two_recorded_operands_keep_the_record():
    args = (rng.standard_normal(30), rng.standard_normal(30), 2)
    k = kadj.differentiate(two_recorded)
    check_grad(k, args)
    _kernel, f = _facts(two_recorded, *args)
    assert "c" in f.pushed


def test_a_transcendental_keeps_its_record():
    args = (rng.standard_normal(30), 2)
    check_grad(kadj.differentiate(transcendental), args)
    _kernel, f = _facts(transcendental, *args)
    assert "s" in f.pushed


def test_iterations_skipped_before_the_recorded_value():
    u = rng.uniform(0.2, 0.9, 40)
    k = rng.uniform(0.2, 1.0, 40) * np.where(np.arange(40) % 3 == 0, -1.0, 1.0)
    kd = kadj.differentiate(skipped_iterations)
    check_grad(kd, (u, k, 2))
    _kernel, f = _facts(skipped_iterations, u, k, 2)
    assert {"q", "v"} <= f.pushed
