"""Device-resident and multi-stream backward of a Tape in the CUDA simulator: run with
NUMBA_ENABLE_CUDASIM=1 by tests/test_tape_device.py and tests/test_tape_streams.py;
prints one line "CASE <name> OK|FAIL <detail>" per case."""
import sys

import numpy as np
from numba import cuda
from numba.cuda.simulator import api as sim_api
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

import kadj
from kadj import tape_graph
from kadj.cuda_api import CudaDifferentiatedKernel
from cudatools import report_cases
from sim_counters import Counters, device_checks


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
def product(a, b, w, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * b[i] + w[i]


@kadj.differentiate
@cuda.jit
def loss_k(u, w, out):
    i = cuda.grid(1)
    if i < u.shape[0]:
        cuda.atomic.add(out, 0, u[i] * u[i] * (i + 1.0) + w[i] * u[i])


N = 12
RNG = np.random.default_rng(0)
U0, W0 = RNG.random(N), RNG.random(N)


def run(u0, w0, dev, streams=1, steps=3, checked=True):
    """Two fields advanced in alternation; product(u, u, w) passes u twice."""
    mk = cuda.to_device if dev else (lambda a: np.array(a, copy=True))
    us = [mk(u0)] + [mk(np.zeros(N)) for _ in range(steps)]
    ws = [mk(w0)] + [mk(np.zeros(N)) for _ in range(steps)]
    t, out = mk(np.zeros(N)), mk(np.zeros(1))
    with kadj.Tape(streams=streams, check_unrecorded_changes=checked) as tape:
        for k in range(steps):
            step[2, 8](us[k], us[k + 1], 0.2)
            step[2, 8](ws[k], ws[k + 1], 0.3)
        product[2, 8](us[-1], us[-1], ws[-1], t)
        loss_k[2, 8](t, ws[-1], out)
    return tape, us, ws, out


def fd_grad(which, eps=1e-6):
    def f(x):
        args = (x, W0) if which == 0 else (U0, x)
        return float(run(*args, False)[3][0])
    x0 = U0 if which == 0 else W0
    return np.array([(f(x0 + eps * e) - f(x0 - eps * e)) / (2 * eps)
                     for e in np.eye(N)])


def device_resident(streams):
    tape, us, ws, out = run(U0, W0, True, streams=streams)
    with Counters() as c:
        tape.backward(out)
        gu, gw = tape.grad(us[0]), tape.grad(ws[0])
    assert c.copies == 0 and c.syncs == 0, \
        f"backward copied {c.copies} arrays to the host and synchronised {c.syncs} times"
    assert isinstance(gu, FakeCUDAArray) and isinstance(gw, FakeCUDAArray), type(gu)
    host, hus, hws, hout = run(U0, W0, False)
    host.backward(hout)
    gu, gw = gu.copy_to_host(), gw.copy_to_host()
    assert np.allclose(gu, host.grad(hus[0]), rtol=1e-12, atol=0), "u0 differs from host"
    assert np.allclose(gw, host.grad(hws[0]), rtol=1e-12, atol=0), "w0 differs from host"
    err = max(np.abs(gu - fd_grad(0)).max(), np.abs(gw - fd_grad(1)).max())
    assert err < 1e-6, f"gradient differs from finite differences by {err}"
    got = tape.scalar_grad("alpha", kernel="step")
    want = host.scalar_grad("alpha", kernel="step")
    assert abs(got - want) <= 1e-12 * abs(want), (got, want)
    # a second backward adds on the device, still without copies
    with Counters() as c:
        tape.backward(out)
    assert c.copies == 0 and c.syncs == 0, "the second backward copied to the host"
    g2 = tape.grad(us[0]).copy_to_host()
    assert np.allclose(g2, 2 * gu, rtol=1e-12), "gradients do not add up on the device"
    # a device cotangent is seeded on the device
    tape.zero()
    seed = cuda.to_device(np.array([2.0]))
    with Counters() as c:
        tape.backward(seeds=[(out, seed)])
    assert c.copies == 0, "a device seed went through the host"
    assert np.allclose(tape.grad(us[0]).copy_to_host(), 2 * gu, rtol=1e-12)
    return err


def device_resident_checked():
    """With the check for unrecorded changes on, taken on the device (as on a GPU):
    recording, backward and grad make no copy to the host and no synchronisation,
    and the gradients are those of the unchecked tape, exactly."""
    with device_checks():
        with Counters() as c:
            tape, us, ws, out = run(U0, W0, True, steps=2)
            tape.backward(out)
            gu, gw = tape.grad(us[0]), tape.grad(ws[0])
        assert tape._flag is not None, "the device path was not taken"
    assert c.copies == 0 and c.syncs == 0, \
        f"{c.copies} copies to the host and {c.syncs} synchronisations"
    tape.check()
    plain, pus, pws, pout = run(U0, W0, True, steps=2, checked=False)
    plain.backward(pout)
    for g, x in ((gu, pus[0]), (gw, pws[0])):
        g, want = g.copy_to_host(), plain.grad(x).copy_to_host()
        assert np.array_equal(g, want) and np.abs(want).max() > 0, (g, want)
    return 0.0


def add_into_case():
    a, b = RNG.random((3, 5)), RNG.random((3, 5))
    da, db = cuda.to_device(a), cuda.to_device(b)
    with Counters() as c:
        kadj.arrays.add_into(da, db)
        z = kadj.arrays.zeros_like(da)
    assert c.copies == 0, "add_into went through the host"
    assert isinstance(z, FakeCUDAArray) and not z.copy_to_host().any()
    err = float(np.abs(da.copy_to_host() - (a + b)).max())
    assert err == 0.0, err
    return err


def streams_case():
    """streams=2: the adjoints of the two fields on different streams, each launch
    after the events of the launches it depends on; gradients equal streams=1."""
    log = []
    record, wait = sim_api.Event.record, sim_api.Event.wait
    run_adjoint = CudaDifferentiatedKernel._run_adjoint

    def rec(ev, stream=0):
        log.append(("record", id(ev), id(stream)))
        return record(ev, stream)

    def wt(ev, stream=0):
        log.append(("wait", id(ev), id(stream)))
        return wait(ev, stream)

    def launch(self, config, args, kwargs=None):
        log.append(("launch", self.__name__,
                    id(config[2]) if len(config) > 2 else None))
        return run_adjoint(self, config, args, kwargs)

    one, us1, ws1, out1 = run(U0, W0, True, streams=1)
    one.backward(out1)
    tape, us, ws, out = run(U0, W0, True, streams=2)
    again, us2, ws2, out2 = run(U0, W0, True, streams=2)
    nodes = tape.schedule()
    sim_api.Event.record, sim_api.Event.wait = rec, wt
    CudaDifferentiatedKernel._run_adjoint = launch
    try:
        tape.backward(out)
        first = len(log)
        again.backward(out2)
    finally:
        sim_api.Event.record, sim_api.Event.wait = record, wait
        CudaDifferentiatedKernel._run_adjoint = run_adjoint
    # a second backward runs on the same two streams (kadj.tape_streams keeps them)
    later = {e[2] for e in log[first:] if e[0] == "launch"}
    log[first:] = []
    assert later == {e[2] for e in log if e[0] == "launch"}, "new streams at a backward"
    for x1, x in ((us1[0], us2[0]), (ws1[0], ws2[0])):
        a, b = one.grad(x1).copy_to_host(), again.grad(x).copy_to_host()
        assert np.array_equal(a, b), f"the second backward differs: {a - b}"
    for x1, x in ((us1[0], us[0]), (ws1[0], ws[0])):
        a, b = one.grad(x1).copy_to_host(), tape.grad(x).copy_to_host()
        assert np.array_equal(a, b), f"streams=2 differs from streams=1: {a - b}"
    # the schedule: u's steps and w's steps on different streams, one event (where
    # they meet, at product/loss)
    u_steps = {n.stream for n in nodes if n.kernel == "step" and n.launch % 2 == 0}
    w_steps = {n.stream for n in nodes if n.kernel == "step" and n.launch % 2 == 1}
    assert len(u_steps) == 1 and len(w_steps) == 1 and u_steps != w_steps, nodes
    assert sum(len(n.waits) for n in nodes) == 1, nodes
    # the launches ran on the streams of the schedule, in its order, after the waits
    launches = [e for e in log if e[0] == "launch"]
    assert [e[1] for e in launches] == [n.kernel for n in nodes], launches
    streams_by_node = [e[2] for e in launches]
    ids = {}
    for n, sid in zip(nodes, streams_by_node):
        assert ids.setdefault(n.stream, sid) == sid, "a scheduled stream changed"
    assert len(set(ids.values())) == 2, "two streams were not used"
    check_happens_before(log, nodes, tape.launches)
    return 0.0


def check_happens_before(log, nodes, launches):
    """From the log alone: every two adjoints that share a buffer are ordered (same
    stream in order, or through a recorded event waited on by the later stream)."""
    done_by = {}           # stream id -> set of launch numbers known complete there
    mine = {}              # stream id -> launch numbers issued on it so far
    event_covers = {}
    issued = []
    node_iter = iter(nodes)
    for e in log:
        if e[0] == "record":
            sid = e[2]
            event_covers[e[1]] = set(mine.get(sid, ())) | done_by.get(sid, set())
        elif e[0] == "wait":
            done_by.setdefault(e[2], set()).update(event_covers.get(e[1], set()))
        else:
            node = next(node_iter)
            sid = e[2]
            before = set(mine.get(sid, ())) | done_by.get(sid, set())
            keys = set(tape_graph.slot_keys(launches[node.launch]))
            for other in issued:
                if keys & set(tape_graph.slot_keys(launches[other])):
                    assert other in before, \
                        f"launch {node.launch} may run before {other}, which it needs"
            mine.setdefault(sid, []).append(node.launch)
            issued.append(node.launch)


def main(names):
    cases = {"device_resident_one_stream": lambda: device_resident(1),
             "device_resident_two_streams": lambda: device_resident(2),
             "device_resident_checked": device_resident_checked,
             "add_into_on_device": add_into_case,
             "streams_in_simulator": streams_case}
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
