"""The inverse heat problem decomposed over MPI ranks, with kadj.mpi.

Recovers the initial temperature u0 of a 2-D plate (fixed walls along axis 0, periodic
along axis 1) from the temperature observed after ``--steps`` explicit steps.  Each rank
holds its block of the field with one ghost layer; a step is a halo exchange and one
launch of an ``@kadj.differentiate @numba.njit`` stencil, inside
``kadj.checkpointed_loop``; the misfit is summed over the ranks with
``kadj.mpi.allreduce_sum``.  Gradient descent with Barzilai-Borwein steps; rank 0
prints the progress.

    mpiexec -n 4 python scripts/mpi_heat_inverse.py [--size 256 --steps 200 --iters 20]
    mpiexec -n 2 python scripts/mpi_heat_inverse.py --measure
    mpiexec -n 2 python scripts/mpi_heat_inverse.py --exchange

``--measure`` times, instead of the inversion, one forward (no tape) and one gradient
(forward and backward on a tape), and the halo exchanges in the gradient: the median
seconds per forward and per adjoint exchange, whole and without the time spent
waiting for the neighbours (the slowest rank's medians and wall times), against the
exchanges of the forward run as well.  ``--exchange`` times one exchange and its
adjoint alone, on the same warm array; with ``--cold``, each exchange and each adjoint
comes after a pass over a buffer larger than the last-level cache (recorded as a custom
step, so that it also runs between the adjoints), as inside a simulation, where the
kernels between two exchanges evict the ghost layers and slabs from the caches.
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

import kadj
import kadj.mpi
from kadj.demo.heat_mpi import heat2d_wrt_u as heat, misfit2d as misfit


def blocks(n, parts):
    return [len(c) for c in np.array_split(np.arange(n), parts)]


class Problem:
    def __init__(self, comm, size, steps, snapshots, alpha=0.2):
        self.comm, self.steps, self.snapshots, self.alpha = comm, steps, snapshots, alpha
        dims = tuple(MPI.Compute_dims(comm.size, 2))
        coords = np.unravel_index(comm.rank, dims)
        shape = tuple(blocks(size, p)[c] + 2 for p, c in zip(dims, coords))
        self.halo = kadj.mpi.Halo(comm, shape, width=1, dims=dims,
                                  periodic=(False, True))
        self.dims = dims
        self.exchange = self.halo.exchange
        # the true initial state: two warm spots, known only through the observation
        x = np.linspace(0, 1, size)
        X, Y = np.meshgrid(x, x, indexing="ij")
        true = np.exp(-60 * ((X - 0.3) ** 2 + (Y - 0.6) ** 2)) + \
            0.5 * np.exp(-40 * ((X - 0.7) ** 2 + (Y - 0.3) ** 2))
        self.true = self.local(true)
        self.observed = self.local(np.zeros((size, size)))
        self.observed[...] = self.run(self.true)
        self.part, self.loss = np.zeros(1), np.zeros(1)

    def local(self, field):
        """This rank's block of a global field, with zero ghost layers (the walls)."""
        u = np.zeros(self.halo.shape)
        u[self.halo.interior] = self.halo.local_part(field)
        return u

    def step(self, i, u, v):
        self.exchange(u)
        heat(u, v, self.alpha)
        return v, u

    def run(self, u0):
        u, v = u0.copy(), u0.copy()
        for i in range(self.steps):
            u, v = self.step(i, u, v)
        return u

    def gradient(self, u0):
        u, v = u0.copy(), u0.copy()
        with kadj.Tape() as tape:
            a, _ = kadj.checkpointed_loop(self.step, (u, v), steps=self.steps,
                                          snapshots=self.snapshots)
            misfit(a, self.observed, self.part)
            kadj.mpi.allreduce_sum(self.comm, self.part, self.loss)
        tape.backward(self.loss)
        g = np.zeros_like(u)             # the ghost layers (the walls) are not unknowns
        g[self.halo.interior] = tape.grad(u)[self.halo.interior]
        return self.loss[0], g


def dot(comm, a, b):
    return comm.allreduce(float(np.sum(a * b)))


def invert(p, iters, say):
    u0 = np.zeros(p.halo.shape)
    loss0, g = p.gradient(u0)
    lr = 1.0
    for it in range(iters):
        start = time.perf_counter()
        u_new = u0 - lr * g
        loss, g_new = p.gradient(u_new)
        s, y = u_new - u0, g_new - g
        lr = dot(p.comm, s, s) / max(dot(p.comm, s, y), 1e-300)   # Barzilai-Borwein
        u0, g = u_new, g_new
        err = np.sqrt(dot(p.comm, u0 - p.true, u0 - p.true) /
                      dot(p.comm, p.true, p.true))
        say(f"iteration {it + 1:3d}: misfit {loss / loss0:.3e} of the first, "
            f"error of u0 {err:.3f}, {time.perf_counter() - start:.2f} s")
    return u0


def measure(p, say, repeat):
    comm, halo = p.comm, p.halo
    u0 = p.true.copy()
    p.gradient(u0)                               # compile and warm up
    results = {}
    for name, fn in (("forward", lambda: p.run(u0)), ("gradient", lambda: p.gradient(u0))):
        halo.timings = {"forward": [0, 0.0, 0.0], "adjoint": [0, 0.0, 0.0]}
        halo.samples = {"forward": [], "adjoint": []}
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        wall = comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / repeat
        results[name] = (wall, {k: tuple(v) for k, v in halo.timings.items()},
                         halo.samples)
    halo.samples = None
    p.exchange = lambda u: None                  # the same work without exchanges
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeat):
        p.gradient(u0)
    alone = comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / repeat
    p.exchange = halo.exchange
    fwd, grad = results["forward"][0], results["gradient"][0]
    (nf, tf, _), (na, ta, _) = (results["gradient"][1][k] for k in ("forward", "adjoint"))
    samples = results["gradient"][2]

    def median(kind, own, samples=samples):
        """The slowest rank's median seconds per exchange: all of it, or its own work
        (the time not spent waiting for a neighbour's messages)."""
        x = [t - w if own else t for t, w in samples[kind]]
        return comm.allreduce(float(np.median(x)), op=MPI.MAX)
    say(f"ranks {comm.size} dims {p.dims}: forward {fwd * 1e3:.1f} ms, gradient "
        f"{grad * 1e3:.1f} ms ({grad / fwd:.2f}x the forward; without the exchanges "
        f"{alone * 1e3:.1f} ms); a gradient runs {nf // repeat} forward and "
        f"{na // repeat} adjoint exchanges, {(tf + ta) / repeat / grad:.0%} of its time")
    mf, ma, of, oa = (median(k, own) for own in (False, True)
                      for k in ("forward", "adjoint"))
    per_f, per_a = tf / max(nf, 1), ta / max(na, 1)
    say(f"  exchanges in the gradient: forward {mf * 1e6:.0f} us, adjoint "
        f"{ma * 1e6:.0f} us (medians, {ma / mf:.2f}x; means {per_f * 1e6:.0f} and "
        f"{per_a * 1e6:.0f} us, {per_a / per_f:.2f}x); without the waits for the "
        f"neighbours: forward {of * 1e6:.1f} us, adjoint {oa * 1e6:.1f} us "
        f"({oa / of:.2f}x)")
    # the forward simulation's own exchanges (no tape), against the adjoint's
    rf, rof = (median("forward", own, results["forward"][2]) for own in (False, True))
    say(f"  against the forward run's exchanges: forward {rf * 1e6:.0f} us, adjoint "
        f"{ma * 1e6:.0f} us ({ma / rf:.2f}x); without the waits: forward "
        f"{rof * 1e6:.1f} us, adjoint {oa * 1e6:.1f} us ({oa / rof:.2f}x)")


def measure_exchange(p, say, repeat, calls=500, cold=False):
    """One exchange and its adjoint alone: ``calls`` exchanges of the same array on a
    tape, then its backward (their adjoints), ``repeat`` times; warm, or ``cold``: a
    pass over a 64 MB buffer before each exchange and each adjoint, the forward's
    exchanges timed without a tape."""
    comm, halo = p.comm, p.halo
    u, g = p.true.copy(), p.true.copy()
    big = np.zeros(8 << 20)

    def evict(*adjoints):
        big[::8] += 1.0                  # one load and store per 64-byte line

    def run():
        if cold:    # the forward's exchanges as a simulation runs them: no tape (whose
            for _ in range(calls):      # recording reads the array first)
                evict()
                halo.exchange(u)
        timed = len(halo.samples["forward"]) if halo.samples else 0
        with kadj.Tape() as tape:
            for _ in range(calls):
                if cold:
                    kadj.custom_step(evict, evict, name="evict")
                halo.exchange(u)
        tape.backward(seeds=[(u, g)])
        if cold and halo.samples:
            del halo.samples["forward"][timed:]
    run()                                        # warm up
    halo.samples = {"forward": [], "adjoint": []}
    for _ in range(repeat):
        comm.Barrier()
        run()
    samples, halo.samples = halo.samples, None

    def median(kind, own):
        x = [t - w if own else t for t, w in samples[kind]]
        return comm.allreduce(float(np.median(x)), op=MPI.MAX)
    mf, ma, of, oa = (median(k, own) for own in (False, True)
                      for k in ("forward", "adjoint"))
    say(f"ranks {comm.size} dims {p.dims}, one exchange of a {p.halo.shape} array, "
        f"{'cold' if cold else 'warm'} (medians of {repeat * calls}): forward {mf * 1e6:.1f} us, adjoint "
        f"{ma * 1e6:.1f} us ({ma / mf:.2f}x); without the waits for the neighbours: "
        f"{of * 1e6:.1f} us and {oa * 1e6:.1f} us ({oa / of:.2f}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="global grid: size x size")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--snapshots", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--exchange", action="store_true",
                    help="time one exchange and its adjoint alone")
    ap.add_argument("--cold", action="store_true",
                    help="with --exchange: evict the caches before each exchange and "
                         "each adjoint")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD

    def say(text):
        if comm.rank == 0:
            print(text, flush=True)

    start = time.perf_counter()
    p = Problem(comm, args.size, args.steps, args.snapshots)
    say(f"{comm.size} ranks, process grid {p.dims}, local block {p.halo.shape} "
        f"(ghosts included), {args.steps} steps, {args.snapshots} snapshots")
    if args.exchange:
        measure_exchange(p, say, args.repeat, calls=100 if args.cold else 500,
                         cold=args.cold)
    elif args.measure:
        measure(p, say, args.repeat)
    else:
        invert(p, args.iters, say)
    say(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
