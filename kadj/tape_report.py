"""What a :class:`kadj.Tape` holds: :class:`MemoryReport` (``tape.memory_report()``),
and the total gradient of a scalar argument over launches (``tape.scalar_grad``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from . import arrays
from .errors import DifferentiationError

__all__ = ["LoopReport", "MemoryReport", "nbytes", "scalar_arg_name", "scalar_total"]


def nbytes(a):
    """Bytes held by an array of any kind kadj accepts."""
    if type(a) is np.ndarray:
        return a.nbytes
    shape, dtype = tuple(a.shape), np.dtype(a.dtype)
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def level(a):
    """The memory an array lives in: "host" (NumPy) or "device" (the simulator's
    arrays count as device arrays: they stand for them)."""
    return "host" if arrays.kind(a) == "host" else "device"


@dataclass(frozen=True)
class LoopReport:
    """One :func:`kadj.checkpointed_loop` on the tape.

    steps:               steps of the loop.
    snapshot_limit:      the ``snapshots`` it was given.
    snapshots_now:       state copies held now (the tape's copy of the initial state
                         counts as one).
    peak_snapshots:      most state copies held at once, the same way.
    snapshot_bytes:      bytes of the loop's own copies held now (not the initial
                         state's, which the tape holds, nor the working state's).
    peak_snapshot_bytes: most bytes of the loop's own copies held at once.
    working_bytes:       bytes of the working copy of the state used by the backward.
    forward_executions:  step executions so far, first sweep included.
    recomputed_steps:    of those, the ones beyond the first sweep.
    """

    steps: int
    snapshot_limit: int
    snapshots_now: int
    peak_snapshots: int
    snapshot_bytes: int
    peak_snapshot_bytes: int
    working_bytes: int
    forward_executions: int
    recomputed_steps: int


@dataclass(frozen=True)
class MemoryReport:
    """``tape.memory_report()``.

    launches:            entries on the tape (a checkpointed loop counts one, plus
                         one for the arrays its steps read).
    snapshots:           array copies the tape keeps.
    snapshot_bytes:      bytes of those copies plus the loops' own snapshots, now.
    peak_snapshot_bytes: most such bytes held at once.
    by_array:            snapshot bytes per array, named by its first use
                         ("kernel.argument (launch #k)").
    by_level:            snapshot bytes per memory level ("host", "device").
    loops:               one :class:`LoopReport` per checkpointed loop.
    """

    launches: int
    snapshots: int
    snapshot_bytes: int
    peak_snapshot_bytes: int
    by_array: dict
    by_level: dict
    loops: tuple

    def __str__(self):
        lines = [f"kadj.Tape: {self.launches} launches, {self.snapshots} snapshots, "
                 f"{_size(self.snapshot_bytes)} held now, "
                 f"{_size(self.peak_snapshot_bytes)} at peak"]
        for name, b in sorted(self.by_array.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name}: {_size(b)}")
        for lvl, b in sorted(self.by_level.items()):
            lines.append(f"  level {lvl}: {_size(b)}")
        for j, lp in enumerate(self.loops):
            lines.append(
                f"  checkpointed loop {j}: {lp.steps} steps, {lp.snapshots_now} of "
                f"{lp.snapshot_limit} snapshots held now ({lp.peak_snapshots} at peak; "
                f"{_size(lp.snapshot_bytes)} now, {_size(lp.peak_snapshot_bytes)} at "
                f"peak, working state {_size(lp.working_bytes)}), "
                f"{lp.forward_executions} step executions "
                f"({lp.recomputed_steps} recomputed)")
        return "\n".join(lines)


def _size(b):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b} B"


def build(launches, tracked_arrays, snapshot_bytes, peak_bytes, loops):
    """The report of a tape (called under its lock)."""
    by_array, by_level, count = {}, {}, 0
    for tracked in tracked_arrays:
        held = sum(nbytes(c) for c in tracked.snapshots.values())
        count += len(tracked.snapshots)
        if not tracked.snapshots:
            continue
        launch = launches[tracked.first[0]]
        name = (f"{launch.plan.kernel_name}.{launch.arg_name(tracked.first[1])} "
                f"(launch #{launch.index})")
        by_array[name] = by_array.get(name, 0) + held
        lvl = level(tracked.array)
        by_level[lvl] = by_level.get(lvl, 0) + held
    loop_reports = []
    for loop in loops:
        rep = loop.report()
        loop_reports.append(rep)
        if rep.snapshot_bytes:
            lvl = level(loop.user[0])
            by_level[lvl] = by_level.get(lvl, 0) + rep.snapshot_bytes
    now = snapshot_bytes + sum(r.snapshot_bytes for r in loop_reports)
    return MemoryReport(len(launches), count, now, max(peak_bytes, now), by_array,
                        by_level, tuple(loop_reports))


_SLOT = re.compile(r"^(?P<kernel>.+)\[(?P<pos>\d+)\]\.(?P<arg>[^.]+)$")


def scalar_arg_name(arg):
    """The argument name of a scalar slot: ``"alpha"`` for ``"alpha"`` and for a
    checkpointed loop's ``"heat[0].alpha"``."""
    slot = _SLOT.match(arg)
    return arg if slot is None else slot["arg"]


def scalar_total(grads, name, kernel=None):
    """Sum the :class:`kadj.tape.ScalarGrad` entries of argument ``name`` (of kernel
    ``kernel``, a name or a kernel, when given), the slots of checkpointed loops
    (``"heat[0].alpha"``) included; refuse a name several kernels use."""
    if kernel is not None and not isinstance(kernel, str):
        kernel = getattr(kernel, "__name__", None) or str(kernel)
    total, kernels, found = 0.0, set(), False
    for g in grads:
        owner, arg = g.kernel_name, g.arg_name
        slot = _SLOT.match(arg)
        if slot is not None:
            owner, arg = slot["kernel"], slot["arg"]
        if arg != name or (kernel is not None and owner != kernel):
            continue
        kernels.add(owner)
        total += g.value
        found = True
    if not found:
        where = f" of kernel '{kernel}'" if kernel is not None else ""
        known = sorted({(_SLOT.match(g.arg_name)["arg"] if _SLOT.match(g.arg_name)
                         else g.arg_name) for g in grads})
        raise DifferentiationError(
            f"No recorded launch has a differentiable scalar argument '{name}'{where}; "
            f"the tape's scalar arguments are: {', '.join(known) or 'none'}.")
    if len(kernels) > 1:
        raise DifferentiationError(
            f"Scalar argument '{name}' belongs to several kernels "
            f"({', '.join(sorted(kernels))}), which may be different parameters; "
            f"pass kernel= to choose one: tape.scalar_grad('{name}', kernel=...).")
    return total
