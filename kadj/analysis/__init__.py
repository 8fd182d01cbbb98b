"""Analyses on the region tree that the reverse pass relies on, returned as frozen
:class:`Facts`.

- **activity** (``varied``, :mod:`.activity`): which float variables and arrays depend
  on a differentiable input; only those get adjoint code.  Flow-insensitive fixpoint
  over the whole kernel (conservative: a variable is varied if any assignment to it is).
- **arrays**: which arrays are read, written, read-and-written (the adjoint runs its
  forward sweep on a work copy of those, never on the user's array), which have
  adjoint arrays.
- **recomputation** (``recompute``, :mod:`.recompute`): per ``for ... in range`` loop,
  the statements at the top of its body the reverse sweep recomputes instead of
  storing them.
- **needed / pushed** (TBR, :mod:`.needed`): the values the reverse sweep reads, and
  of those the ones recorded on a tape.
- **loops** (:mod:`.loops`): the reversal strategy of each loop: ascending, replayed
  per iteration (checkpointed), values saved once around it.
"""
from __future__ import annotations

from numba.core import types

from .. import ir
from ..errors import DifferentiationError
from . import activity as _activity
from . import loops as _loops
from . import needed as _needed
from . import recompute as _recompute
from .facts import Facts, MemoryPolicy, _Work, freeze
from .first_def import fresh_definitions
from .loops import reverse_reads, stale_loads_harmless, upward_exposed
from .memory import rewritten_each_iteration
from .needed import partial_reads
from .recompute import reads_outside

Analysis = Facts
_reads_outside = reads_outside  # the name kadj.reverse imports

__all__ = ["Analysis", "Facts", "MemoryPolicy", "analyze", "fresh_definitions",
           "partial_reads", "reverse_reads", "rewritten_each_iteration",
           "stale_loads_harmless", "upward_exposed"]


def analyze(kernel, slot_args, returns_value=True, carried_replay=False,
            private_scratch=(), unwritten=(), shared_scratch=(), owned_shared=(), *,
            policy=None) -> Facts:
    """The :class:`Facts` of ``kernel`` whose arguments ``slot_args`` get adjoints.
    The target's memory policy comes as ``policy=`` (a :class:`MemoryPolicy`) or as
    the keywords of its fields."""
    if policy is None:
        policy = MemoryPolicy(carried_replay, private_scratch, unwritten,
                              shared_scratch, owned_shared)
    elif carried_replay or private_scratch or unwritten or shared_scratch or owned_shared:
        raise TypeError("analyze: give the memory policy as policy= or as keywords, "
                        "not both")
    facts = _analyze(kernel, slot_args, returns_value, policy, None)
    if _recompute.cheap_recorded(kernel, facts.pushed):
        # values recorded that are cheap arithmetic of another recorded value: again,
        # recomputing those (kept when it records fewer variables)
        again = _analyze(kernel, slot_args, returns_value, policy, facts.pushed)
        if len(again.pushed) < len(facts.pushed):
            return again
    return facts


def _analyze(kernel, slot_args, returns_value, policy, wanted):
    a = _Work(kernel=kernel, slot_args=tuple(slot_args), policy=policy)
    T = kernel.types
    body = kernel.body
    _activity.check_values(kernel)
    _activity.count_assignments(kernel, a)
    _activity.check_scratch_placement(kernel)
    a.loaded = ir.loaded_arrays(body)
    a.stored = ir.stored_arrays(body)
    a.work_arrays = a.param_arrays & a.loaded & a.stored
    _activity.loop_assigned(body, a, False)
    _activity.activity(kernel, a)
    _activity.usefulness(kernel, a, returns_value)
    _recompute.recompute(body, a, wanted)
    # fixpoint: the values replayed loops read are needed too (the replay runs in the
    # reverse sweep); needing more values may record more and replay more loops
    extra = set()
    while True:
        a.loop_saved = {}
        a.loop_unsaved = {}
        _needed.needed(body, a, extra)
        restored = set(a.restore_arrays)
        _pushed(kernel, a)
        a.ascending = set()
        for s in ir.walk(body):
            if isinstance(s, ir.ForRange) and _loops.order_free(s, a):
                a.ascending.add(s.uid)
        _replay(body, a)
        lost = {x for x, uid in a.scratch_owner.items() if uid not in a.replay}
        if lost:
            # scratch arrays whose rewriting loop is not replayed after all: restored
            a.scratch_kept |= lost
            for x in lost:
                del a.scratch_owner[x]
            continue
        more = _loops.replay_reads(body, a) - a.needed
        if not more and not a.restore_arrays - restored - a.varied_arrays:
            # the values saved once around loops; the ifs around such a loop are
            # re-decided in the reverse sweep to pop them: their conditions are needed
            _loops.find_loop_saved(body, a, frozenset(), False)
            more = _loops.conditions_around_saves(body, a) - a.needed
            if not more:
                break   # (an array without adjoint restored anew: its stores pop)
        extra |= more
    for v in a.pushed:
        t = T.get(v)
        if not isinstance(t, (types.Number, types.Boolean)):
            raise DifferentiationError(
                f"the value of '{v}' ({t}) is overwritten but needed by the reverse sweep",
                kernel=kernel.name, construct="overwritten non-scalar value",
                remedy="assign the value to a new variable instead of overwriting it")
    # the adjoint never writes an unwritten array (a CUDA cell's): no work copy of it,
    # nothing of it to restore
    a.work_arrays -= a.unwritten
    a.restore_arrays -= a.unwritten
    return freeze(a)


def _pushed(kernel, a):
    """The needed values the forward overwrites and cannot recompute; an ``if`` that
    records values must be re-decided in the reverse sweep to pop them: its condition
    is needed too (fixpoint)."""
    body = kernel.body
    loop_indices = {s.index for s in ir.walk(body) if isinstance(s, ir.ForRange)}
    while True:
        for v in a.needed:
            if v in loop_indices and a.assign_count.get(v, 0) == 0:
                continue
            if any(v in rv for rv in a.recompute_vars.values()):
                continue
            defs = a.assign_count.get(v, 0) + (1 if v in kernel.args else 0)
            if defs > 1 or v in a.in_loop:
                a.pushed.add(v)
        extra = set()
        for s in _needed.walk_reversed(body, a):
            if isinstance(s, ir.If) and isinstance(s.cond, ir.Var) and \
                    s.cond.name not in a.needed and _needed.records_in_branches(s, a):
                extra.add(s.cond.name)
        if not extra:
            break
        a.needed |= extra


def _replay(body, a):
    """Replayed loops, fixpoint: a replayed iteration reads arrays as they were, so
    those written elsewhere are restored (which may stop other loops from being
    replayed), and a replay may rely on an enclosing loop's replay rewriting a shared
    tile (that loop is then replayed too)."""
    while True:
        forced = set(a.force_replay)
        a.replay = {}
        a.replay_fresh = set()
        a.checkpoint = {}
        a.checkpoint_arrays = {}
        a.checkpoint_owned = {}
        a.replay_shared = {}
        a.tile_owners = set()
        _loops.find_replay(body, a, False)
        extra = set()
        for st in ir.walk(body):
            if isinstance(st, (ir.ForRange, ir.Loop)) and st.uid in a.replay:
                harmless, owners = _loops.stale_loads(st, a)
                a.tile_owners |= owners
                if not harmless:
                    extra |= (ir.loaded_arrays(st.body) & a.stored) - a.unwritten
        a.force_replay |= a.tile_owners
        if extra <= a.restore_arrays and a.force_replay == forced:
            break
        a.restore_arrays |= extra
