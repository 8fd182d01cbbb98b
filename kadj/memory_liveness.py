"""Liveness of the forward sweep under a target's memory policy.

The forward sweep keeps the statements whose values the reverse sweep needs
(:class:`kadj.forward_sweep.ForwardSweep`).  A target adds to that, as data on its
writer (policies, not code):

- ``space``: the memory space of each scratch array the adjoint declares itself
  ({array: "local" | "shared"}).  The forward sweep stores into such an array only
  if values loaded from it later are needed (an in-place sum needs none): a fixpoint
  between the kept loads and the live arrays.  While a block-shared array is live the
  forward keeps its barriers (``keep_barriers``).
- ``declares_allocations``: allocations are declared in the adjoint's prologue, so the
  forward sweep has none to run (nor any to write, ``alloc``).
- ``kernel_returns``: False when the kernel returns nothing (its returns, and branches
  holding only them, have nothing to do in the forward sweep).
- ``entry_state_live``: what the forward saves at a loop's entry (recorded state,
  checkpoint 0) must hold its value there even where the loop's own updates of it are
  dead (not an unset register).
- arrays the adjoint never writes (analysis ``unwritten``): their stores are not run.
- arrays that replayed iterations rewrite whole, or whose rows they restore, before
  reading them (CPU, analysis ``replay_shared``): stored only while a kept load reads
  them (the forward sweep of a replayed loop whose results nothing else reads is
  not run at all).

With the defaults (a CPU kernel) this is the forward sweep's own liveness.
"""
from __future__ import annotations

from types import MappingProxyType

from . import ir


class MemoryLiveness:
    space = MappingProxyType({})
    declares_allocations = False
    kernel_returns = True
    entry_state_live = False
    _replay_live = frozenset()

    def liveness(self):
        a = self.a
        if self.space:
            self._live_arrays = set()
            # read again in the reverse sweep: recomputed loads, replayed iterations
            for stmts in a.recompute.values():
                self._live_arrays |= ir.loaded_arrays(stmts)
            for x in ir.walk(self.k.body):
                if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid in a.replay:
                    self._live_arrays |= ir.loaded_arrays(x.body)
            while True:
                self.keep_barriers = any(self.space.get(v) == "shared"
                                         for v in self._live_arrays)
                super().liveness()
                loaded = {x.expr.array.name for x in ir.walk(self.k.body)
                          if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and
                          id(x) in self.kept}
                if loaded <= self._live_arrays:
                    break
                self._live_arrays |= loaded
        else:
            # arrays that only replayed iterations read, which rewrite (or restore)
            # them first: stored by the forward sweep only while a load it keeps
            # reads them
            self._replay_live = set()
            while True:
                super().liveness()
                loaded = {x.expr.array.name for x in ir.walk(self.k.body)
                          if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and
                          not x.expr.entry and id(x) in self.kept} & \
                    self.replay_rewritten()
                if loaded <= self._replay_live:
                    break
                self._replay_live |= loaded
        if self.kernel_returns and not self.declares_allocations:
            return
        for x in ir.walk(self.k.body):
            if (isinstance(x, ir.Return) and not self.kernel_returns) or (
                    self.declares_allocations and isinstance(x, ir.Assign) and
                    isinstance(x.expr, ir.Alloc)):
                self.kept.discard(id(x))
        changed = True
        while changed:
            changed = False
            for x in ir.walk(self.k.body):
                if isinstance(x, ir.If) and id(x) in self.kept and not any(
                        id(y) in self.kept for y in ir.walk(x.then + x.orelse)
                        if not isinstance(y, ir.If)):
                    self.kept.discard(id(x))
                    changed = True

    def _live(self, stmts, live, ctx):
        if not self.entry_state_live:
            return super()._live(stmts, live, ctx)
        a = self.a
        for s in reversed(stmts):
            live = super()._live((s,), live, ctx)
            if isinstance(s, (ir.ForRange, ir.Loop)) and id(s) in self.kept:
                live = live | set(a.loop_saved.get(s.uid, ())) | set(
                    a.replay.get(s.uid, ()))
        return live

    def alloc(self, s, depth):
        if not self.declares_allocations:  # (else declared in the prologue)
            super().alloc(s, depth)

    def replay_rewritten(self):
        """Without checkpoints: the arrays that replayed iterations rewrite whole or
        restore the rows of before reading them (analysis ``replay_shared`` on a
        CPU): the reverse sweep never reads what the forward sweep stored there."""
        a = self.a
        if a.carried_replay:
            return frozenset()
        out = set()
        for names in a.replay_shared.values():
            out |= set(names)
        return frozenset(out - a.shared_scratch)

    def _stmt_needed(self, s):
        if isinstance(s, ir.Store):
            if s.array.name in self.a.unwritten:
                return False  # later reads use a scalar in its place
            if s.array.name in self.space:
                return s.array.name in self._live_arrays
            if s.array.name in self.replay_rewritten():
                return s.array.name in self._replay_live
        return super()._stmt_needed(s)
