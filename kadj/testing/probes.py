"""Finite-difference probes, their confirmation with a smaller step, and kink
verdicts.

A probe compares central differences of ``C F`` along a direction with what the
adjoint rows ``G`` predict for the same rounded steps, within ``atol``, ``rtol`` and
an estimate of the rounding noise.

Scales are root-sum-squares, not absolute sums.  The cotangent and the direction are
random, so the terms ``G_i d_i`` of the inner product, and the rounding errors
``C_k e_k`` of ``C F``, add with random signs: their sums grow like the square root
of their number, as the inner product itself does.  An absolute sum grows like the
number of terms, and would let a gradient wrong by the same factor everywhere pass
at large sizes.  ``rtol`` is relative to the largest of ``|<G, d>|``,
``sqrt(sum_i (G_i d_i)^2)`` and ``sqrt(sum_k (C_k (J d)_k)^2)`` (the latter from the
differences, so that a scalar's gradient, one term that is a sum over the outputs,
is not judged by that sum's chance cancellation); the rounding noise is estimated as
``64 * unit_roundoff * sqrt(sum_k (C_k F_k)^2) / step`` over the outputs that differ
between ``x + t d`` and ``x - t d`` (the kernel is deterministic: an output the step
does not reach is computed, and rounded, alike both times).  For a single output, a
unit cotangent or a unit direction these are the plain magnitudes.  The central
difference is taken as ``C (F(x+) - F(x-))``, not ``C F(x+) - C F(x-)``: the outputs the
step does not reach then add exactly zero, where two long sums (a large returned total
among them) would each round on the scale of their largest terms and their difference
carry it.

A probe whose noise exceeds half that scale cannot tell the adjoint from one wrong by
half (float32 finite differences of an ill-conditioned map): unless the adjoint
predicts a zero inner product (below ``atol``), it is ``undecidable``, and the checks
fail rather than pass it.

A disagreement is confirmed with a step ``_REFINE`` times smaller (truncation error
shrinks sixteen-fold, a wrong gradient stays wrong); a disagreement that shrank so and
whose differences, extrapolated to a zero step from the two steps, agree with the
adjoint is truncation error, not a wrong gradient; where the forward and backward
one-sided differences disagree with each other at both steps, the point looks like a
kink or tie, and the one-sided derivatives are extrapolated to a zero step.

The estimate of the rounding noise from the outputs' sizes misses what cancellation
inside the kernel adds: a residual ``(u[i-1] - 2 u[i] + u[i+1]) / h**2`` with ``h**2 =
6e-5``, a factor ``1 - r`` with ``r = 3.6e5``, round on the scale of intermediate values
far larger than the outputs.  So a disagreement confirmed at both steps is measured
against the noise itself, before it is reported: ``C F`` at eight points spaced the
smaller step apart along the direction (the noise a difference over that step meets,
also where the intermediates round in steps larger than it), whose k-th differences
(k = 2 to 6) are small for the smooth part and grow for the noise (the ECnoise estimate of Moré
and Wild: sigma_k**2 = (k!)**2 / (2k)! * mean((Delta^k f)**2), the median over k).
Differences within ``_MEASURED_FACTOR`` such sigmas (over the step) of the adjoint at
both steps agree; where that noise is more than half the inner product, the probe is
undecidable, as above.  A wrong gradient is still caught wherever finite differences
can see it at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import factorial

import numpy as np

from .forward import _read_inputs, _run_forward, _with_inputs
from .problem import _Tol

_NOISE_FACTOR = 64.0
_REFINE = 4.0       # a disagreement is confirmed with a step this many times smaller
_DECIDABLE = 0.5    # largest noise, relative to the scale, that a probe can resolve
_NOISE_POINTS = 8   # function values along the direction for the measured noise
_NOISE_SPACING = 1.0    # their spacing, relative to the smaller step
_MEASURED_FACTOR = 8.0  # measured noise (standard deviations) a difference may hold


@dataclass(frozen=True)
class _Probe:
    """Differences of ``C F`` at ``x + t d`` and ``x - t d`` for cotangent rows ``C``,
    next to what the adjoint rows ``G`` predict for the same rounded steps.

    Arrays hold one entry per row of ``C``; derivatives are per unit of ``d``, divided
    by the steps actually taken along ``d`` (``sp`` forward, ``sm`` backward).
    """

    sp: float
    sm: float
    cp: np.ndarray      # C F(x+)
    cm: np.ndarray      # C F(x-)
    cd: np.ndarray      # C (F(x+) - F(x-)): outputs the step does not reach add 0
    pp: np.ndarray      # G (x+ - x)
    pm: np.ndarray      # G (x - x-)
    f_abs: np.ndarray   # root-sum-square of C_k max(|F_k(x+)|, |F_k(x-)|), F_k changed
    g_abs: np.ndarray   # root-sum-square of G_i (x+ - x-)_i
    o_abs: np.ndarray   # root-sum-square of C_k (F_k(x+) - F_k(x-))
    s_abs: np.ndarray   # root-sum-square of C_k max(|F_k(x+)|, |F_k(x-)|), F_k unchanged
    tol: _Tol

    @property
    def fd(self):
        return self.cd / (self.sp + self.sm)

    @property
    def ad(self):
        return (self.pp + self.pm) / (self.sp + self.sm)

    @property
    def predicted(self):
        """The size of the inner product the adjoint predicts."""
        return np.maximum(np.abs(self.ad), self.g_abs / (self.sp + self.sm))

    @property
    def magnitude(self):
        return np.maximum(self.predicted, self.o_abs / (self.sp + self.sm))

    @property
    def noise(self):
        """The estimated rounding noise of ``fd``."""
        return _NOISE_FACTOR * self.tol.unit * self.f_abs / (self.sp + self.sm)

    @property
    def allowed(self):
        t = self.tol
        return t.atol + t.rtol * self.magnitude + self.noise

    @property
    def absorbed(self):
        """Rows whose disagreement fits in the rounding of the outputs the step left
        unchanged: an output large next to its change (a returned total of 1e48 that a
        change of 10 does not move) rounds to the same value on both sides, and the
        differences then miss its change altogether."""
        hidden = _NOISE_FACTOR * self.tol.unit * self.s_abs / (self.sp + self.sm)
        return ~self.agrees & (np.abs(self.fd - self.ad) <= self.allowed + hidden)

    @property
    def agrees(self):
        return np.abs(self.fd - self.ad) <= self.allowed

    @property
    def undecidable(self):
        """Rows whose noise hides an error of half the inner product's size, where
        the adjoint predicts a nonzero one."""
        return ((self.predicted > self.tol.atol)
                & (self.noise > _DECIDABLE * self.magnitude))

    def one_sided(self, c0, f0_abs):
        """(forward and backward differences, each minus the adjoint's prediction for
        its half step, and the allowed size of their difference), given ``C F(x)``."""
        if self.sp <= 0.0 or self.sm <= 0.0:
            zero = np.zeros_like(self.cp)
            return zero, zero, np.full_like(self.cp, np.inf)
        forward = (self.cp - c0 - self.pp) / self.sp
        backward = (c0 - self.cm - self.pm) / self.sm
        t = self.tol
        allowed = (t.atol + t.rtol * self.magnitude + _NOISE_FACTOR * t.unit
                   * (self.f_abs + f0_abs) / min(self.sp, self.sm))
        return forward, backward, allowed

    def slopes(self, c0):
        """The forward and backward one-sided derivatives, given ``C F(x)``."""
        return (self.cp - c0) / self.sp, (c0 - self.cm) / self.sm


def _probe(problem, point, d, t, cts, rows, tol, what):
    delta = t * d
    plus = _with_inputs(problem, point.x + delta)
    minus = _with_inputs(problem, point.x - delta)
    dp = _read_inputs(problem, plus) - point.x
    dm = point.x - _read_inputs(problem, minus)
    dd = float(d @ d)
    sp, sm = float(dp @ d) / dd, float(dm @ d) / dd
    if not sp + sm > 0.0:
        raise AssertionError(_zero_step(problem, what))
    yp, ym = _run_forward(problem, plus), _run_forward(problem, minus)
    dy = yp - ym
    size = np.maximum(np.abs(yp), np.abs(ym))
    moved = np.where(yp != ym, size, 0.0)
    still = np.where(yp != ym, 0.0, size)
    return _Probe(sp, sm, cts @ yp, cts @ ym, cts @ dy, rows @ dp, rows @ dm,
                  _rss(cts, moved), _rss(rows, dp + dm), _rss(cts, dy), _rss(cts, still),
                  tol)


def _rss(rows, v):
    """``sqrt(sum_i (rows[r, i] v_i)^2)`` for each row ``r``, without overflow."""
    rows, v = np.abs(np.asarray(rows, dtype=np.float64)), np.abs(v)
    sr = float(rows.max(initial=0.0))
    sv = float(v.max(initial=0.0))
    if not (0.0 < sr < np.inf and 0.0 < sv < np.inf):
        return rows @ v         # all zeros, or an infinite or NaN scale kept
    return sr * sv * np.sqrt((rows / sr) ** 2 @ (v / sv) ** 2)


def _zero_step(problem, what):
    return (f"check_grad's step for {what} of kernel '{problem.name}' rounds to zero "
            "in the input's dtype; pass a larger eps.")


@dataclass(frozen=True)
class _Verdict:
    """A probe at step t and, where it disagreed, the confirming probe at t / 4."""

    first: _Probe
    second: object      # _Probe or None
    measured: object = None     # the measured noise of C F, per row, or None

    @property
    def agrees(self):
        if self.second is None:
            return self.first.agrees
        return self.first.agrees | self.second.agrees | self.extrapolated_agrees | \
            self.within_measured_noise

    def _measured(self, probe):
        """The measured noise of ``probe``'s differences (zeros when not measured)."""
        if self.measured is None:
            return np.zeros(probe.cp.shape)
        return _MEASURED_FACTOR * self.measured / (probe.sp + probe.sm)

    @property
    def within_measured_noise(self):
        """Rows whose differences at both steps are within the noise measured along
        the direction (and the tolerances) of the adjoint's prediction."""
        if self.measured is None:
            return np.zeros(self.first.cp.shape, dtype=bool)
        return np.logical_and.reduce([
            np.abs(p.fd - p.ad) <= p.allowed + self._measured(p)
            for p in (self.first, self.second)])

    @property
    def extrapolated_agrees(self):
        """Rows where the disagreement is the central differences' truncation error:
        it shrank at least half as fast as a smooth function's (sixteen-fold for a
        four times smaller step), and the differences extrapolated to a zero step
        (Richardson) agree with the adjoint.  A wrong adjoint stays wrong there."""
        a, b = self.first, self.second
        r2 = _REFINE * _REFINE
        d1, d2 = np.abs(a.fd - a.ad), np.abs(b.fd - b.ad)
        limit = self._limit()
        slack = (r2 + 1.0) / (r2 - 1.0)       # the extrapolation's rounding noise
        return (d2 * (0.5 * r2) <= d1) & (np.abs(limit - b.ad) <= slack * b.allowed)

    def _pick(self, name):
        value = getattr(self.first, name)
        if self.second is None:
            return value
        return np.where(self.first.agrees, value, getattr(self.second, name))

    @property
    def fd(self):
        """The differences that decided: the first step's, the confirming step's, or
        their extrapolation to a zero step where only that agrees."""
        value = self._pick("fd")
        if self.second is None:
            return value
        only = ~self.first.agrees & ~self.second.agrees & self.extrapolated_agrees
        return np.where(only, self._limit(), value)

    def _limit(self):
        return _to_zero_step(self.first.fd, self.second.fd, order=2)

    @property
    def ad(self):
        return self._pick("ad")

    @property
    def allowed(self):
        return self._pick("allowed")

    @property
    def magnitude(self):
        return self._pick("magnitude")

    @property
    def noise(self):
        value = self._pick("noise")
        if self.measured is None:
            return value
        return np.where(self.within_measured_noise,
                        np.maximum(value, self._measured(self.second)), value)

    @property
    def undecidable(self):
        value = self._pick("undecidable")
        if self.measured is None:
            return value
        loud = (self.second.predicted > self.second.tol.atol) & \
            (self._measured(self.second) > _DECIDABLE * self.second.magnitude)
        return value | (self.within_measured_noise & loud)

    @property
    def absorbed(self):
        """Rows that disagree at both steps only within the rounding of outputs the
        steps left unchanged: finite differences cannot decide them."""
        if self.second is None:
            return np.zeros(self.first.cp.shape, dtype=bool)
        return ~self.agrees & self.first.absorbed & self.second.absorbed

    def kinks(self, c0, f0_abs):
        """Rows where the one-sided differences disagree with each other by more than
        the tolerance at both steps, without shrinking as the step does (a smooth
        function's disagreement shrinks with the step; a kink's or a tie's does not)."""
        if self.second is None:
            return np.zeros(self.first.cp.shape, dtype=bool)
        f1, b1, _ = self.first.one_sided(c0, f0_abs)
        f4, b4, allowed = self.second.one_sided(c0, f0_abs)
        jump1, jump4 = np.abs(f1 - b1), np.abs(f4 - b4)
        return ~self.agrees & (jump4 > allowed) & (jump4 > 0.5 * jump1)

    def kink_values(self, c0, row):
        """(forward slope, backward slope, adjoint, whether the adjoint is one of the
        one-sided derivatives) for ``row``, extrapolated to a zero step."""
        f1, b1 = self.first.slopes(c0)
        f4, b4 = self.second.slopes(c0)
        fwd = _to_zero_step(f1[row], f4[row], order=1)
        bwd = _to_zero_step(b1[row], b4[row], order=1)
        ad = float(self.second.ad[row])
        slack = max(float(self.second.allowed[row]), 0.05 * abs(fwd - bwd))
        return fwd, bwd, ad, min(abs(ad - fwd), abs(ad - bwd)) <= slack


def _to_zero_step(coarse, fine, order):
    """Richardson extrapolation to a zero step of differences taken at a step and at
    one ``_REFINE`` times smaller, whose error falls as the step to ``order`` (central
    differences 2, one-sided 1)."""
    r = _REFINE ** order
    return (r * fine - coarse) / (r - 1.0)


def _confirmed(problem, point, d, t, cts, rows, tol, what):
    first = _probe(problem, point, d, t, cts, rows, tol, what)
    if bool(np.all(first.agrees)):
        return _Verdict(first, None)
    verdict = _Verdict(first, _probe(problem, point, d, t / _REFINE, cts, rows, tol,
                                     what))
    if bool(np.all(verdict.agrees)):
        return verdict
    return _Verdict(verdict.first, verdict.second,
                    _measured_noise(problem, point, d, t / _REFINE, cts))


def _measured_noise(problem, point, d, t, cts):
    """The rounding noise of ``C F`` along ``d`` near ``x``, per row of ``C``: the
    median over k = 2..6 of the ECnoise estimates from ``_NOISE_POINTS`` values spaced
    ``_NOISE_SPACING * t`` apart (see the module docstring)."""
    h = _NOISE_SPACING * t
    offsets = h * (np.arange(_NOISE_POINTS) - 0.5 * (_NOISE_POINTS - 1))
    values = np.stack([cts @ _run_forward(problem, _with_inputs(problem, point.x + o * d))
                       for o in offsets], axis=-1)
    estimates = []
    diff = values
    for k in range(1, 7):
        diff = np.diff(diff, axis=-1)
        if k >= 2:
            gamma = factorial(k) ** 2 / factorial(2 * k)
            estimates.append(np.sqrt(gamma * np.mean(diff * diff, axis=-1)))
    return np.median(np.stack(estimates), axis=0)


def _unit(problem, j):
    d = np.zeros(problem.n_in)
    d[j] = 1.0
    return d
