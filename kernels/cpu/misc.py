"""Neural-network pieces and control flow: ReLU, GELU, clipping, in-place
updates, helpers returning tuples, break/continue, early return, prange."""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._example import Example
from ..sizes import at_least, grid2


@njit
def relu_dense(w, x, b, out):
    """out = relu(W @ x + b), W indexed with tuples."""
    for i in range(w.shape[0]):
        z = b[i]
        for j in range(w.shape[1]):
            z += w[i, j] * x[j]
        if z > 0.0:
            out[i] = z
        else:
            out[i] = 0.0


def relu_dense_sized(rng, n):
    """A (rows, cols) weight matrix of about n entries."""
    rows, cols = grid2(n, smallest=1)
    w = rng.standard_normal((rows, cols))
    x = rng.standard_normal(cols)
    b = rng.standard_normal(rows)
    z = w @ x + b
    b = b + np.where(z > 0.0, 0.2, -0.2)          # |pre-activation| >= 0.2
    return w, x, b, rng.random(rows)


def relu_dense_args(rng):
    w = rng.standard_normal((6, 5))
    x = rng.standard_normal(5)
    b = rng.standard_normal(6)
    z = w @ x + b
    b = b + np.where(z > 0.0, 0.2, -0.2)          # |pre-activation| >= 0.2
    return w, x, b, rng.random(6)


@njit
def mlp_tanh_loss(w1, b1, w2, x, target):
    """Squared error of a one-hidden-layer tanh network; hidden layer in np.zeros."""
    nh = w1.shape[0]
    hidden = np.zeros(nh)
    for i in range(nh):
        for j in range(w1.shape[1]):
            hidden[i] += w1[i, j] * x[j]
        hidden[i] = math.tanh(hidden[i] + b1[i])
    y = 0.0
    for i in range(nh):
        y += w2[i] * hidden[i]
    return 0.5 * (y - target) ** 2


def mlp_tanh_loss_sized(rng, n):
    """A (hidden, inputs) first layer of about n weights, scaled by 1/sqrt(inputs)."""
    nh, ni = grid2(n, smallest=1)
    scale = 1.0 / math.sqrt(ni)
    return (rng.standard_normal((nh, ni)) * scale, rng.standard_normal(nh) * 0.5,
            rng.standard_normal(nh), rng.standard_normal(ni), 0.7)


def mlp_tanh_loss_args(rng):
    return (rng.standard_normal((6, 5)) * 0.5, rng.standard_normal(6) * 0.5,
            rng.standard_normal(6), rng.standard_normal(5), 0.7)


@njit
def gelu(x, out):
    """GELU activation with the exact erf form."""
    for i in range(x.shape[0]):
        out[i] = 0.5 * x[i] * (1.0 + math.erf(x[i] / math.sqrt(2.0)))


def gelu_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n) * 2.0, np.zeros(n)


def gelu_args(rng):
    return gelu_sized(rng, 16)


@njit
def clip(x, out, lo, hi):
    """out = min(max(x, lo), hi)."""
    for i in range(x.shape[0]):
        out[i] = min(max(x[i], lo), hi)


def clip_sized(rng, n):
    # Values at least 0.05 away from lo=-0.5 and hi=0.6.
    n = at_least(n, 1)
    x = rng.uniform(-1.2, 1.2, n)
    for edge in (-0.5, 0.6):
        near = np.abs(x - edge) < 0.05
        x[near] += 0.1
    return x, np.zeros(n), -0.5, 0.6


def clip_args(rng):
    return clip_sized(rng, 20)


@njit
def inplace_update(x, y, a, b):
    """All four augmented assignments on one output element."""
    for i in range(x.shape[0]):
        y[i] += a * x[i]
        y[i] -= b * x[i] * x[i]
        y[i] *= a
        y[i] /= 1.0 + x[i] * x[i]


def inplace_update_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.standard_normal(n), 1.3, 0.4


def inplace_update_args(rng):
    return inplace_update_sized(rng, 12)


def inplace_update_f32_sized(rng, n):
    x, y, a, b = inplace_update_sized(rng, n)
    return x.astype(np.float32), y.astype(np.float32), np.float32(a), np.float32(b)


def inplace_update_f32_args(rng):
    return inplace_update_f32_sized(rng, 12)


@njit
def _to_polar(x, y):
    return math.hypot(x, y), math.atan2(y, x)


@njit
def to_polar(x, y, r, theta):
    """Cartesian to polar through a helper returning a pair."""
    for i in range(x.shape[0]):
        ri, ti = _to_polar(x[i], y[i])
        r[i] = ri
        theta[i] = ti


def to_polar_sized(rng, n):
    # Angles in (-0.8 pi, 0.8 pi): away from atan2's branch cut on the negative x axis.
    n = at_least(n, 1)
    ang = rng.uniform(-0.8 * np.pi, 0.8 * np.pi, n)
    rad = rng.uniform(0.5, 2.0, n)
    return rad * np.cos(ang), rad * np.sin(ang), np.zeros(n), np.zeros(n)


def to_polar_args(rng):
    return to_polar_sized(rng, 10)


@njit
def _rotation(angle):
    return math.cos(angle), math.sin(angle)


@njit
def rotate_points(pts, out, angle):
    """Rotate (n, 2) points by angle; cos and sin returned as a pair by a helper."""
    c, s = _rotation(angle)
    for i in range(pts.shape[0]):
        out[i, 0] = c * pts[i, 0] - s * pts[i, 1]
        out[i, 1] = s * pts[i, 0] + c * pts[i, 1]


def rotate_points_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal((n, 2)), np.zeros((n, 2)), 0.7


def rotate_points_args(rng):
    return rotate_points_sized(rng, 8)


@njit
def budget_sum(cost, value, budget):
    """Take items in order while their total cost stays within budget (break)."""
    spent = 0.0
    total = 0.0
    for i in range(cost.shape[0]):
        if spent + cost[i] > budget:
            break
        spent += cost[i]
        total += value[i] * math.sqrt(cost[i])
    return total


def budget_sum_sized(rng, n):
    """n items; the budget runs out after about 3/5 of them, midway between two
    cumulative costs."""
    n = at_least(n, 2)
    cost = rng.uniform(0.5, 1.5, n)
    c = np.cumsum(cost)
    k = min(n - 2, (3 * n) // 5)
    return cost, rng.standard_normal(n), float(0.5 * (c[k] + c[k + 1]))


def budget_sum_args(rng):
    cost = rng.uniform(0.5, 1.5, 15)
    c = np.cumsum(cost)
    budget = 0.5 * (c[8] + c[9])          # stops after 9 items, far from a tie
    return cost, rng.standard_normal(15), float(budget)


@njit
def masked_log_sum(x, mask):
    """sum of log(x) over entries with mask set and x positive (continue)."""
    s = 0.0
    for i in range(x.shape[0]):
        if mask[i] == 0:
            continue
        if x[i] <= 0.0:
            continue
        s += math.log(x[i])
    return s


def masked_log_sum_sized(rng, n):
    n = at_least(n, 1)
    sign = np.where(rng.random(n) < 0.3, -1.0, 1.0)
    return sign * rng.uniform(0.2, 3.0, n), (rng.random(n) < 0.7).astype(np.int64)


def masked_log_sum_args(rng):
    return masked_log_sum_sized(rng, 20)


@njit
def first_crossing(x, thresh):
    """Fractional index where x first rises above thresh (early return), else -1."""
    if x.shape[0] < 2:
        return -1.0
    for i in range(1, x.shape[0]):
        if x[i] > thresh:
            return (i - 1) + (thresh - x[i - 1]) / (x[i] - x[i - 1])
    return -1.0


def first_crossing_sized(rng, n):
    """n samples rising from 0 to 2, first crossing 1.0 near the middle by a clear
    margin."""
    n = at_least(n, 2)
    x = np.linspace(0.0, 2.0, n) + 0.05 * rng.standard_normal(n)
    k = max(1, n // 2)
    x[:k] = np.minimum(x[:k], 0.8)
    x[k - 1] = 0.8 - 0.1 * rng.random()
    x[k] = 1.2 + 0.1 * rng.random()
    return x, 1.0


def first_crossing_args(rng):
    x = np.linspace(0.0, 2.0, 12) + 0.05 * rng.standard_normal(12)
    x[:6] = np.minimum(x[:6], 0.8)        # first crossing of 1.0 at a clear margin
    x[5] = 0.8 - 0.1 * rng.random()
    x[6] = 1.2 + 0.1 * rng.random()
    return x, 1.0


@njit(parallel=True)
def damped_tanh_parallel(x, y, out, a):
    """Elementwise map over prange."""
    for i in prange(x.shape[0]):
        out[i] = a * x[i] * math.exp(-y[i]) + math.tanh(x[i])


def damped_tanh_parallel_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.random(n), np.zeros(n), 0.8


def damped_tanh_parallel_args(rng):
    return damped_tanh_parallel_sized(rng, 32)


@njit(parallel=True)
def allen_cahn_reaction_parallel(u, k, dt, steps):
    """Reaction substeps of an Allen-Cahn splitting, in place: a time loop around a
    prange over the cells."""
    for t in range(steps):
        for i in prange(u.shape[0]):
            v = u[i]
            u[i] = v + dt * k[i] * (v - v * v * v)


def allen_cahn_reaction_parallel_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(-0.9, 0.9, n), 0.5 + rng.random(n), 0.1, 4


def allen_cahn_reaction_parallel_args(rng):
    return allen_cahn_reaction_parallel_sized(rng, 32)


@njit
def soft_threshold(x, out, lam):
    """Shrinkage operator of ISTA: three-way branch, one branch stores a constant."""
    for i in range(x.shape[0]):
        if x[i] > lam:
            out[i] = x[i] - lam
        elif x[i] < -lam:
            out[i] = x[i] + lam
        else:
            out[i] = 0.0


def soft_threshold_sized(rng, n):
    # |x| in [0, 0.4] or [0.6, 2]: away from lam = 0.5.
    n = at_least(n, 1)
    mag = np.where(rng.random(n) < 0.4, rng.uniform(0.0, 0.4, n), rng.uniform(0.6, 2.0, n))
    return np.where(rng.random(n) < 0.5, -mag, mag), rng.random(n), 0.5


def soft_threshold_args(rng):
    return soft_threshold_sized(rng, 16)


@njit
def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


@njit
def _swish(z, beta):
    return z * _sigmoid(beta * z)


@njit
def swish(x, out, beta):
    """Swish activation through a helper that calls another helper."""
    for i in range(x.shape[0]):
        out[i] = _swish(x[i], beta)


def swish_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n) * 2.0, np.zeros(n), 1.3


def swish_args(rng):
    return swish_sized(rng, 14)


@njit
def interleaved_magnitude(z, out):
    """|z| for complex numbers stored interleaved (re, im) in a float array."""
    for i in range(out.shape[0]):
        out[i] = math.hypot(z[2 * i], z[2 * i + 1])


def interleaved_magnitude_sized(rng, n):
    """n complex numbers."""
    n = at_least(n, 1)
    z = (rng.standard_normal(2 * n) + 0.5).reshape(n, 2)
    r = np.hypot(z[:, 0], z[:, 1])
    z[r < 0.1] *= (0.1 / r[r < 0.1])[:, None]       # |z| >= 0.1: away from hypot's kink
    return z.ravel(), np.zeros(n)


def interleaved_magnitude_args(rng):
    return interleaved_magnitude_sized(rng, 12)


@njit
def power_law(x, out, c, p):
    """out = c * x**p with a differentiable exponent (x > 0)."""
    for i in range(x.shape[0]):
        out[i] = c * x[i] ** p


def power_law_sized(rng, n):
    n = at_least(n, 1)
    return rng.uniform(0.5, 3.0, n), np.zeros(n), 1.7, 1.5


def power_law_args(rng):
    return power_law_sized(rng, 12)


EXAMPLES = [
    Example("relu_dense", relu_dense, relu_dense_args, tags=("nn", "2d", "branch"),
            sized=relu_dense_sized),
    Example("mlp_tanh_loss", mlp_tanh_loss, mlp_tanh_loss_args,
            tags=("nn", "2d", "scratch", "returns"),
            sized=mlp_tanh_loss_sized),
    Example("gelu", gelu, gelu_args, tags=("nn", "math"),
            sized=gelu_sized),
    Example("clip", clip, clip_args, tags=("branch", "minmax"),
            sized=clip_sized),
    Example("inplace_update", inplace_update, inplace_update_args, tags=("inplace",),
            sized=inplace_update_sized),
    Example("inplace_update_f32", inplace_update, inplace_update_f32_args,
            tags=("inplace", "float32"),
            sized=inplace_update_f32_sized),
    Example("to_polar", to_polar, to_polar_args, tags=("helper", "tuple", "math"),
            sized=to_polar_sized),
    Example("rotate_points", rotate_points, rotate_points_args,
            tags=("helper", "tuple", "2d"),
            sized=rotate_points_sized),
    Example("budget_sum", budget_sum, budget_sum_args, tags=("break", "returns"),
            sized=budget_sum_sized),
    Example("masked_log_sum", masked_log_sum, masked_log_sum_args,
            tags=("continue", "returns", "int_args"),
            sized=masked_log_sum_sized),
    Example("first_crossing", first_crossing, first_crossing_args,
            tags=("early_return", "returns"),
            sized=first_crossing_sized),
    Example("soft_threshold", soft_threshold, soft_threshold_args, tags=("branch",),
            sized=soft_threshold_sized),
    Example("swish", swish, swish_args, tags=("nn", "helper"),
            sized=swish_sized),
    Example("interleaved_magnitude", interleaved_magnitude, interleaved_magnitude_args,
            tags=("math",),
            sized=interleaved_magnitude_sized),
    Example("power_law", power_law, power_law_args, tags=("math",),
            sized=power_law_sized),
    Example("damped_tanh_parallel", damped_tanh_parallel, damped_tanh_parallel_args,
            tags=("parallel",),
            sized=damped_tanh_parallel_sized),
    Example("allen_cahn_reaction_parallel", allen_cahn_reaction_parallel,
            allen_cahn_reaction_parallel_args, tags=("parallel",),
            sized=allen_cahn_reaction_parallel_sized),
]
