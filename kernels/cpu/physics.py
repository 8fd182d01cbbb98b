"""Particles and springs: N-body forces, Lennard-Jones, spring chains, Verlet, angles."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least, pairs_to_points


@njit
def nbody_accel(pos, mass, acc, soft2):
    """Softened gravitational accelerations, (n, 3) positions, acc overwritten."""
    n = pos.shape[0]
    for i in range(n):
        ax = 0.0
        ay = 0.0
        az = 0.0
        for j in range(n):
            if j == i:
                continue
            dx = pos[j, 0] - pos[i, 0]
            dy = pos[j, 1] - pos[i, 1]
            dz = pos[j, 2] - pos[i, 2]
            r2 = dx * dx + dy * dy + dz * dz + soft2
            inv_r3 = 1.0 / (r2 * math.sqrt(r2))
            ax += mass[j] * dx * inv_r3
            ay += mass[j] * dy * inv_r3
            az += mass[j] * dz * inv_r3
        acc[i, 0] = ax
        acc[i, 1] = ay
        acc[i, 2] = az


def nbody_accel_sized(rng, n):
    """About n pairs of bodies."""
    p = pairs_to_points(n)
    return rng.standard_normal((p, 3)), rng.uniform(0.5, 1.5, p), np.zeros((p, 3)), 0.05


def nbody_accel_args(rng):
    return rng.standard_normal((6, 3)), rng.uniform(0.5, 1.5, 6), np.zeros((6, 3)), 0.05


@njit
def lj_energy(pos, epsilon, sigma, rcut):
    """Lennard-Jones energy with a hard cutoff (pairs beyond rcut skipped)."""
    n = pos.shape[0]
    rc2 = rcut * rcut
    energy = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            dx = pos[i, 0] - pos[j, 0]
            dy = pos[i, 1] - pos[j, 1]
            r2 = dx * dx + dy * dy
            if r2 > rc2:
                continue
            sr6 = (sigma * sigma / r2) ** 3
            energy += 4.0 * epsilon * (sr6 * sr6 - sr6)
    return energy


def lj_energy_args(rng):
    # A jittered 3x3 lattice with spacing 1.2; rcut sits in the widest gap
    # between pair distances, so no pair is near the cutoff.
    g = np.array([(a, b) for a in range(3) for b in range(3)], dtype=np.float64)
    pos = 1.2 * g + 0.1 * rng.standard_normal((9, 2))
    d = np.sort(np.sqrt(((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1))[np.triu_indices(9, 1)])
    inner = (d > 1.3) & (d < 2.6)
    k = np.argmax(np.where(inner[:-1], np.diff(d), -1.0))
    rcut = 0.5 * (d[k] + d[k + 1])
    return pos, 1.0, 1.0, float(rcut)


def lj_energy_sized(rng, n):
    """About n pairs of atoms: a jittered square lattice (spacing 1.2, jitter small
    enough that distance shells stay apart), cut off between the shells at 1.2*sqrt(2)
    and 2.4, at the middle of the widest gap between pair distances there."""
    p = pairs_to_points(n, smallest=4)
    side = int(math.ceil(math.sqrt(p)))
    g = np.array([(a, b) for a in range(side) for b in range(side)][:p], dtype=np.float64)
    pos = 1.2 * g + 0.02 * rng.standard_normal((p, 2))
    diff = pos[:, None, :] - pos[None, :, :]
    d = np.sort(np.sqrt((diff ** 2).sum(-1))[np.triu_indices(p, 1)])
    d = d[(d > 1.8) & (d < 2.3)]
    edges = np.concatenate([[1.8], d, [2.3]])
    k = int(np.argmax(np.diff(edges)))
    return pos, 1.0, 1.0, float(0.5 * (edges[k] + edges[k + 1]))


@njit
def spring_chain_energy(x, y, k, rest):
    """Elastic energy of a 2-D chain of springs, lengths by math.hypot."""
    energy = 0.0
    for i in range(x.shape[0] - 1):
        length = math.hypot(x[i + 1] - x[i], y[i + 1] - y[i])
        stretch = length - rest
        energy += 0.5 * k * stretch * stretch
    return energy


def _walk(rng, n, length, turn):
    """A 2-D chain of n points centred on the origin: bonds of ``length`` (+-10%),
    each turning left or right by ``turn`` radians (+-0.05) from the one before, so
    its extent grows like sqrt(n) and finite-difference steps, relative to the
    coordinates, stay small against the bonds."""
    turns = np.where(rng.random(n) < 0.5, -1.0, 1.0) * (turn + 0.05 * rng.uniform(-1, 1, n))
    heading = np.cumsum(turns)
    bonds = length * rng.uniform(0.9, 1.1, n)
    pos = np.zeros((n, 2))
    pos[1:, 0] = np.cumsum(bonds[1:] * np.cos(heading[1:]))
    pos[1:, 1] = np.cumsum(bonds[1:] * np.sin(heading[1:]))
    return pos - pos.mean(axis=0)


def spring_chain_energy_sized(rng, n):
    """A chain of n points wandering in the plane (bonds 0.9 to 1.1, rest 0.9)."""
    pos = _walk(rng, at_least(n, 2), 1.0, 1.0)
    return pos[:, 0].copy(), pos[:, 1].copy(), 3.0, 0.9


def spring_chain_energy_args(rng):
    t = np.arange(10, dtype=np.float64)
    return t + 0.2 * rng.standard_normal(10), 0.3 * rng.standard_normal(10), 3.0, 0.9


@njit
def _chain_accel(x, k, m, a):
    n = x.shape[0]
    for i in range(n):
        f = 0.0
        if i > 0:
            f += k * (x[i - 1] - x[i])
        if i < n - 1:
            f += k * (x[i + 1] - x[i])
        a[i] = f / m


@njit
def velocity_verlet(x, v, k, m, dt, nsteps):
    """Velocity Verlet for a harmonic chain with free ends, in place; one force
    evaluation per step, by a helper writing into a np.empty scratch array."""
    n = x.shape[0]
    a = np.empty(n)
    _chain_accel(x, k, m, a)
    for step in range(nsteps):
        for i in range(n):
            v[i] += 0.5 * dt * a[i]
            x[i] += dt * v[i]
        _chain_accel(x, k, m, a)
        for i in range(n):
            v[i] += 0.5 * dt * a[i]


def velocity_verlet_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.standard_normal(n), 2.0, 1.5, 0.1, 5


def velocity_verlet_args(rng):
    return velocity_verlet_sized(rng, 7)


@njit
def bond_angles(pos, angles):
    """Angle at every interior atom of a 2-D chain, by atan2(cross, dot)."""
    for i in range(1, pos.shape[0] - 1):
        ax = pos[i - 1, 0] - pos[i, 0]
        ay = pos[i - 1, 1] - pos[i, 1]
        bx = pos[i + 1, 0] - pos[i, 0]
        by = pos[i + 1, 1] - pos[i, 1]
        angles[i] = math.atan2(ax * by - ay * bx, ax * bx + ay * by)


def bond_angles_sized(rng, n):
    """A chain of n atoms wandering in the plane, every bond angle near +-110 degrees
    (turns of +-70), far from atan2's branch cut at 180."""
    return _walk(rng, at_least(n, 3), 0.8, math.radians(70.0)), np.zeros(at_least(n, 3))


def bond_angles_args(rng):
    # A zig-zag chain: every angle near +-110 degrees, far from the branch cut.
    n = 9
    pos = np.zeros((n, 2))
    pos[:, 0] = np.arange(n) * 0.8
    pos[:, 1] = np.where(np.arange(n) % 2 == 0, 0.0, 0.6)
    return pos + 0.05 * rng.standard_normal((n, 2)), np.zeros(n)


EXAMPLES = [
    Example("nbody_accel", nbody_accel, nbody_accel_args,
            tags=("physics", "2d", "continue"),
            sized=nbody_accel_sized),
    Example("lj_energy", lj_energy, lj_energy_args,
            tags=("physics", "2d", "returns", "continue", "branch"),
            sized=lj_energy_sized),
    Example("spring_chain_energy", spring_chain_energy, spring_chain_energy_args,
            tags=("physics", "returns"),
            sized=spring_chain_energy_sized),
    Example("velocity_verlet", velocity_verlet, velocity_verlet_args,
            tags=("physics", "ode", "scratch", "helper", "inplace", "int_args"),
            sized=velocity_verlet_sized),
    Example("bond_angles", bond_angles, bond_angles_args, tags=("physics", "2d"),
            sized=bond_angles_sized),
]
