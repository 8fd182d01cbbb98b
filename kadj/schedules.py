"""Checkpointing schedules for reversing a time loop in bounded memory.

A schedule is plain data: a sequence of actions on an abstract executor that holds one
*current* state (the working state) and a set of *snapshots* (copies of the state before a
given step).  Step ``i`` maps the state before step ``i`` (state ``i``) to state ``i + 1``.

Actions (tuples):

``("advance", i, j)``
    Run steps ``i .. j-1`` forward, unrecorded; the current state must be state ``i`` and
    becomes state ``j``.  Costs ``j - i`` forward step executions.
``("store", i)``
    Copy the current state (which must be state ``i``) into a new snapshot.
``("restore", i)``
    Make the snapshot of state ``i`` current (the snapshot stays held).
``("free", i)``
    Drop the snapshot of state ``i``.
``("last", i)``
    Run the final step ``i = n - 1`` forward to produce the loop's result, keeping state
    ``i`` available as the current state for the backward sweep.  Costs one execution.
``("reverse", i)``
    Reverse step ``i``: the current state must be state ``i``; afterwards the current
    state is undefined.  kadj's adjoint of a one-launch step recomputes its own forward
    from the state before the call, so a reversal costs no forward step execution.

The forward sweep ends when step ``n - 1`` has run (by ``last``, or by an ``advance``
reaching ``n``, as in online schedules that do not know ``n`` in advance); the actions
after it form the backward sweep.  Steps are reversed exactly once, in order
``n-1, ..., 0``.  The snapshot count includes the snapshot of the initial state; the
working state is not counted (Revolve's convention).

:func:`binomial` is optimal (Griewank's binomial checkpointing, Revolve): with ``t`` the
smallest integer such that ``C(s + t, s) >= n`` it uses ``t*n - C(s + t, s + 1) + 1``
forward step executions in total, first sweep included.  :func:`simulate` checks any
schedule and counts its executions and peak snapshots.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from math import comb

__all__ = ["ScheduleError", "Schedule", "SimulationResult", "binomial", "binomial_cost",
           "store_all", "periodic", "online", "OnlineSchedule", "simulate"]

ADVANCE, STORE, RESTORE, FREE, LAST, REVERSE = (
    "advance", "store", "restore", "free", "last", "reverse")


class ScheduleError(ValueError):
    """A schedule breaks a rule of the executor model (see :func:`simulate`)."""


@dataclass(frozen=True)
class Schedule:
    """A complete schedule for ``steps`` steps using at most ``snapshots`` snapshots."""
    kind: str
    steps: int
    snapshots: int
    actions: tuple
    forward_len: int = field(default=0)   # number of actions in the forward sweep

    def __iter__(self):
        return iter(self.actions)

    def __len__(self):
        return len(self.actions)

    @property
    def forward(self):
        """The actions of the forward sweep (up to and including the run of step n-1)."""
        return self.actions[:self.forward_len]

    @property
    def backward(self):
        """The actions of the backward sweep."""
        return self.actions[self.forward_len:]


def _forward_len(actions, n):
    for k, act in enumerate(actions):
        if act[0] == LAST or (act[0] == ADVANCE and act[2] == n):
            return k + 1
    raise ScheduleError("the schedule never runs the last step")


def _make(kind, n, s, actions):
    actions = tuple(actions)
    return Schedule(kind, n, s, actions, _forward_len(actions, n))


def _check_args(n, s):
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"steps must be a positive integer, got {n!r}")
    if not isinstance(s, int) or isinstance(s, bool) or s < 1:
        raise ValueError(f"snapshots must be a positive integer, got {s!r}")


# --- binomial (Revolve) -------------------------------------------------------------------

_BETA_CACHE: dict = {}


def _beta_table(c, length):
    """Increasing list of C(c + t, c) for t = 0, 1, ... reaching at least ``length``."""
    table = _BETA_CACHE.get(c)
    if table is None:
        table = _BETA_CACHE[c] = [1]
    while table[-1] < length:
        t = len(table)
        table.append(comb(c + t, c))
    return table


def _beta(c, t):
    return comb(c + t, c) if t >= 0 else 0


def _repetitions(length, c):
    """The smallest t with C(c + t, c) >= length."""
    return bisect.bisect_left(_beta_table(c, length), length)


def binomial_cost(n, s):
    """Forward step executions of the optimal schedule: ``t*n - C(s+t, s+1) + 1``."""
    _check_args(n, s)
    t = _repetitions(n, s)
    return t * n - comb(s + t, s + 1) + 1


def _split(length, c):
    """First advance ``m`` of an optimal reversal of ``length`` steps with ``c`` snapshots.

    The left part (``m`` steps, reversed again with ``c`` snapshots after this advance)
    must need at most ``t - 1`` repetitions and the right part (``length - m`` steps with
    ``c - 1`` snapshots) at most ``t``; both within the range where their cost is linear
    with those slopes, so the total is ``t*length - C(c+t, c+1)``.
    """
    t = _repetitions(length, c)
    lo = max(1, _beta(c, t - 2), length - _beta(c - 1, t))
    hi = min(length - 1, _beta(c, t - 1), length - _beta(c - 1, t - 1))
    if lo > hi:  # cannot happen (see the interval argument above)
        raise AssertionError(f"no optimal split for {length} steps, {c} snapshots")
    return hi


def _reverse_segment(a, b, c, out, last_first):
    """Append actions reversing steps ``b-1 .. a`` with the current state ``a``.

    State ``a`` is held in a snapshot when ``b - a > 1``; ``c`` snapshots are available
    counting that one.  With ``last_first``, the first reversed step is the loop's last
    step, still to be run by the forward sweep (a ``last`` action precedes its reversal).
    """
    stack = [(a, b, c)]
    while stack:
        item = stack.pop()
        if isinstance(item[0], str):
            out.append(item)
            continue
        a, b, c = item
        length = b - a
        if length == 1:
            if last_first:
                out.append((LAST, a))
                last_first = False
            out.append((REVERSE, a))
            continue
        m = _split(length, c)
        mid = a + m
        todo = [(ADVANCE, a, mid)]
        if b - mid > 1:
            todo.append((STORE, mid))
        todo.append((mid, b, c - 1))
        if b - mid > 1:
            todo.append((FREE, mid))
        todo.append((RESTORE, a))
        todo.append((a, mid, c))
        stack.extend(reversed(todo))


def binomial(n, s):
    """The optimal offline (Revolve) schedule for ``n`` steps and ``s`` snapshots."""
    _check_args(n, s)
    out = []
    if n > 1:
        out.append((STORE, 0))
    _reverse_segment(0, n, s, out, last_first=True)
    if n > 1:
        out.append((FREE, 0))
    return _make("binomial", n, s, out)


# --- simple offline schedules -------------------------------------------------------------

def _segment_store_all(a, e, out):
    """Reverse steps ``e-1 .. a`` (state ``a`` held): re-run them once, storing each state."""
    out.append((RESTORE, a))
    for j in range(a, e - 1):
        out.append((ADVANCE, j, j + 1))
        if j + 1 < e - 1:
            out.append((STORE, j + 1))
    out.append((REVERSE, e - 1))
    for j in range(e - 2, a, -1):
        out.append((RESTORE, j))
        out.append((REVERSE, j))
        out.append((FREE, j))
    if e - 1 > a:
        out.append((RESTORE, a))
        out.append((REVERSE, a))


def store_all(n):
    """Snapshot the state before every step: ``n`` executions, ``max(1, n-1)`` snapshots."""
    _check_args(n, 1)
    return _with_kind(periodic(n, 1), "store_all")


def _with_kind(schedule, kind):
    return Schedule(kind, schedule.steps, schedule.snapshots, schedule.actions,
                    schedule.forward_len)


def periodic(n, every):
    """Snapshot every ``every`` steps; the backward re-runs each segment once, storing it.

    Holds at most ``ceil(n / every) + every - 2`` snapshots and runs ``n`` steps in the
    forward sweep plus ``L - 1`` per segment of ``L`` steps (``max(0, L - 2)`` for the
    last segment, whose last state is current when the backward starts).
    """
    _check_args(n, every)
    out = []
    starts = list(range(0, n, every))
    last = starts[-1]
    for a in starts:
        if a < n - 1:          # state n-1 stays current after ``last``
            out.append((STORE, a))
        b = min(a + every, n)
        if b == n:
            if b - 1 > a:
                out.append((ADVANCE, a, n - 1))
            out.append((LAST, n - 1))
        else:
            out.append((ADVANCE, a, b))
    out.append((REVERSE, n - 1))
    if n - 1 > last:
        _segment_store_all(last, n - 1, out)
        out.append((FREE, last))
    for a in reversed(starts[:-1]):
        _segment_store_all(a, min(a + every, n), out)
        out.append((FREE, a))
    peak = _peak(out)
    return _make("periodic", n, max(1, peak), out)


def _peak(actions):
    held = peak = 0
    for act in actions:
        if act[0] == STORE:
            held += 1
            peak = max(peak, held)
        elif act[0] == FREE:
            held -= 1
    return peak


# --- online -------------------------------------------------------------------------------

class OnlineSchedule:
    """Schedule for a loop whose length is not known in advance.

    Call :meth:`step` before running each step: it returns the actions of the forward
    sweep for that step (snapshots to drop, the snapshot to take, and the advance).  When
    the loop has ended, :meth:`finish` returns the whole :class:`Schedule`.

    Strategy: ``h = ceil(s / 2)`` snapshots are kept at multiples of a stride (a power
    of two, doubled and thinned whenever an ``h+1``-th would be needed), so segments
    between kept snapshots are at most ``max(1, 2(n-1)/h)`` steps long (``n`` when
    ``h = 1``).  The backward reverses the segments, last first, each with the optimal
    binomial schedule using the snapshots not kept (at least ``c = floor(s/2) + 1``
    counting the segment's own).  The step ``n - 1`` is not known to be the last when it
    runs, so the backward starts from a snapshot.

    Bound: with ``n`` steps the schedule executes at most ``n + p(n, c)`` forward steps,
    where ``p(n, c) = binomial_cost(n, c) - 1`` is the optimal recomputation with ``c``
    snapshots (``p`` is convex with ``p(0) = 0``, hence superadditive over segments);
    i.e. at most ``binomial_cost(n, s // 2 + 1) + n - 1``.  It never beats
    ``binomial_cost(n, s)``; for long loops and ``s >= 5`` it is typically within
    5-20% of it.
    """

    def __init__(self, snapshots):
        _check_args(1, snapshots)
        self.snapshots = snapshots
        self.keep = max(1, (snapshots + 1) // 2)
        self.stride = 1
        self.held = []
        self.n = 0
        self.actions = []
        self.finished = None

    def step(self):
        """Actions to perform before and for running the next step (step ``self.n``)."""
        if self.finished is not None:
            raise ScheduleError("the online schedule has already been finished")
        i = self.n
        acts = []
        if i % self.stride == 0:
            while len(self.held) >= self.keep:
                self.stride *= 2
                acts.extend((FREE, p) for p in self.held if p % self.stride)
                self.held = [p for p in self.held if p % self.stride == 0]
                if i % self.stride:
                    break
            if i % self.stride == 0 and len(self.held) < self.keep:
                self.held.append(i)
                acts.append((STORE, i))
        acts.append((ADVANCE, i, i + 1))
        self.n += 1
        self.actions.extend(acts)
        return acts

    def finish(self):
        """The complete schedule, once the loop has run ``self.n`` steps."""
        if self.finished is not None:
            return self.finished
        n = self.n
        if n == 0:
            raise ScheduleError("the loop ran no step")
        out = list(self.actions)
        forward_len = len(out)
        bounds = self.held + [n]
        free = self.snapshots - len(self.held)
        for k in range(len(self.held) - 1, -1, -1):
            a, b = bounds[k], bounds[k + 1]
            out.append((RESTORE, a))
            _reverse_segment(a, b, free + 1, out, last_first=False)
            out.append((FREE, a))
            free += 1
        self.finished = Schedule("online", n, self.snapshots, tuple(out), forward_len)
        return self.finished


def online(snapshots):
    """A new :class:`OnlineSchedule` using at most ``snapshots`` snapshots."""
    return OnlineSchedule(snapshots)


# --- simulation ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SimulationResult:
    forward_executions: int     # forward step executions, first sweep included
    peak_snapshots: int
    reversed_steps: int


def simulate(schedule, n, s=None):
    """Run ``schedule`` on a toy executor and check every rule; return its counts.

    Checks: step ``n-1`` runs once in the forward sweep before any reversal; every step is
    reversed exactly once, in order ``n-1 .. 0``, with the state before it current;
    snapshots are stored from and restored to the right state, never twice and never more
    than ``s`` at once (``s=None``: no limit); advances stay within the loop.
    """
    current = 0
    held = set()
    peak = executions = 0
    next_reverse = n - 1
    forward_done = False

    def fail(k, act, msg):
        raise ScheduleError(f"action {k} {act!r}: {msg}")

    for k, act in enumerate(schedule):
        kind = act[0]
        if kind == ADVANCE:
            i, j = act[1], act[2]
            if current != i:
                fail(k, act, f"current state is {current!r}, not {i}")
            if not i < j <= (n - 1 if forward_done else n):
                fail(k, act, "advance out of range")
            executions += j - i
            current = j
            if j == n:
                forward_done = True
        elif kind == STORE:
            i = act[1]
            if current != i:
                fail(k, act, f"current state is {current!r}, not {i}")
            if i in held:
                fail(k, act, "snapshot already held")
            held.add(i)
            peak = max(peak, len(held))
            if s is not None and len(held) > s:
                fail(k, act, f"more than {s} snapshots held")
        elif kind == RESTORE:
            if act[1] not in held:
                fail(k, act, "no such snapshot")
            current = act[1]
        elif kind == FREE:
            if act[1] not in held:
                fail(k, act, "no such snapshot")
            held.discard(act[1])
        elif kind == LAST:
            if forward_done or act[1] != n - 1 or current != n - 1:
                fail(k, act, "the last step must run once, from state n-1")
            executions += 1
            forward_done = True
        elif kind == REVERSE:
            i = act[1]
            if not forward_done:
                fail(k, act, "reversal before the forward sweep ended")
            if i != next_reverse:
                fail(k, act, f"expected to reverse step {next_reverse}")
            if current != i:
                fail(k, act, f"current state is {current!r}, not {i}")
            next_reverse -= 1
            current = None
        else:
            fail(k, act, "unknown action")
    if next_reverse != -1:
        raise ScheduleError(f"steps {next_reverse} .. 0 were never reversed")
    return SimulationResult(executions, peak, n)
