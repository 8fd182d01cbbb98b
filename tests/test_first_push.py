"""No save of a value before its first definition in a loop.

A value a loop body defines afresh in every iteration is saved from the second
iteration on (the first iteration has no value of its own to save), and, when an
enclosing loop records its iterations, once as the loop left it.  The generated
adjoint is run as plain Python with each save checked: a saved variable must have
been assigned since the loop around the save (the innermost one that assigns it) was
entered, unless the loop reads it before assigning it (a value carried in from
before the loop, which must be saved).  Gradients against float64 central finite
differences (tests/fdcheck.py) with trip counts 0, 1, 2 and many.
"""
import ast
import inspect
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import call_memory
from cudatools import run_sim_cases
from fdcheck import fd_check


@njit
def range_fresh(x, n, y):
    s = x[0]
    for i in range(n):
        t = math.sin(s) * x[1]
        u = t * t + x[2]
        s = 0.5 * s + u * t
    y[0] = s


@njit
def while_break_fresh(x, n, y):
    z = x[0]
    k = 0
    while k < n:
        c = math.cos(z)
        w = c * x[1]
        z = z + 0.3 * w * c
        k += 1
        if z > 5.0:
            break
    y[0] = z


@njit
def range_break_fresh(x, n, y):
    s = x[0]
    for i in range(n):
        c = math.cos(s) * x[1]
        s = s + 0.4 * c * c
        if s > 1.0:     # (after 4 iterations here)
            break
    y[0] = s


@njit
def nested_fresh(x, n, y):
    # the outer loop carries s (its iterations are recorded); the inner loop's values
    # t and u are defined afresh in each of its iterations
    s = x[0]
    for i in range(n):
        for j in range(n):
            t = math.sin(s + x[1] * j)
            u = t * x[2]
            s = s * 0.5 + t * u
        s = s + x[2]
    y[0] = s


@njit
def rows_fresh(x, n, y):
    # independent outer iterations (each reversed iteration replays its own)
    for i in range(x.shape[0]):
        z = x[i]
        for j in range(n):
            t = math.cos(z)
            z = z - 0.3 * t * z
        y[i] = z


# ---- the check on the generated source ------------------------------------------------
def _tape_value(node):
    """The variable a push statement saves, or None when ``node`` is not a push."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and
            isinstance(node.targets[0], ast.Subscript) and
            isinstance(node.targets[0].value, ast.Name) and
            node.targets[0].value.id.startswith("_tape")):
        return None
    v = node.value
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "int":
        v = v.args[0]
    if isinstance(v, ast.Attribute):
        v = v.value
    return v.id if isinstance(v, ast.Name) else None


def _names(node, ctx):
    return [x.id for x in ast.walk(node) if isinstance(x, ast.Name) and isinstance(x.ctx, ctx)]


def _events(stmts, out):
    """(kind, name) in execution order of a statement list: 'r' read, 'w' write
    (saves left out: they read what they save)."""
    for s in stmts:
        if _tape_value(s) is not None:
            continue
        if isinstance(s, ast.If):
            out += [("r", n) for n in _names(s.test, ast.Load)]
            _events(s.body, out)
            _events(s.orelse, out)
        elif isinstance(s, ast.For):
            out += [("r", n) for n in _names(s.iter, ast.Load)]
            out += [("w", n) for n in _names(s.target, ast.Store)]
            _events(s.body, out)
        elif isinstance(s, ast.While):
            out += [("r", n) for n in _names(s.test, ast.Load)]
            _events(s.body, out)
        elif isinstance(s, (ast.Assign, ast.AugAssign)):
            if isinstance(s, ast.AugAssign):
                out += [("r", n) for n in _names(s.target, ast.Store)]
            out += [("r", n) for n in _names(s.value, ast.Load)]
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            for t in targets:
                out += [("r", n) for n in _names(t, ast.Load)]
                out += [("w", n) for n in _names(t, ast.Store)]
        else:
            out += [("r", n) for n in _names(s, ast.Load)]
    return out


def _carried(loop, name):
    """Does the loop's body read ``name`` before assigning it?"""
    for kind, n in _events(loop.body, []):
        if n == name:
            return kind == "r"
    return False


class _Instrument:
    def __init__(self, start_line):
        self.start_line = start_line   # assignments before it: the prologue
        self.loops = 0

    def body(self, stmts, stack):
        out = []
        for s in stmts:
            v = _tape_value(s)
            if v is not None:
                loop = next((lp for lid, lp in reversed(stack)
                             if v in _names(ast.Module(lp.body, []), ast.Store)), None)
                lid = None if loop is None else loop._kid
                checked = loop is None or not _carried(loop, v)
                out.append(_call("push", v, lid, s.lineno, checked))
                out.append(s)
                continue
            if isinstance(s, (ast.For, ast.While)):
                self.loops += 1
                s._kid = self.loops
                out.append(_call("enter", s._kid))
                s.body = self.body(s.body, stack + [(s._kid, s)])
                out.append(s)
                continue
            if isinstance(s, ast.If):
                s.body = self.body(s.body, stack)
                s.orelse = self.body(s.orelse, stack)
                out.append(s)
                continue
            out.append(s)
            if isinstance(s, (ast.Assign, ast.AugAssign)) and s.lineno >= self.start_line:
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in targets:
                    for n in _names(t, ast.Store):
                        out.append(_call("define", n))
        return out


def _call(method, *args):
    return ast.Expr(ast.Call(ast.Attribute(ast.Name("_rec", ast.Load()), method, ast.Load()),
                             [ast.Constant(a) for a in args], []))


class _Recorder:
    def __init__(self):
        self.now, self.entered, self.defined, self.bad, self.saves = 0, {}, {}, [], 0

    def _tick(self):
        self.now += 1
        return self.now

    def enter(self, lid):
        self.entered[lid] = self._tick()

    def define(self, name):
        self.defined[name] = self._tick()

    def push(self, name, lid, line, checked):
        self.saves += 1
        if not checked:
            return
        since = -1 if lid is None else self.entered[lid]
        if self.defined.get(name, -2) <= since:
            self.bad.append((name, line))


def first_save_violations(source, args):
    """Run the adjoint ``source`` as plain Python on ``args``: the saves of values not
    yet defined in their loop [(name, line)], and the number of saves made."""
    lines = source.splitlines()
    start = next(i for i, ln in enumerate(lines, 1) if "---- forward sweep ----" in ln)
    tree = ast.parse(source)
    fn = next(x for x in tree.body if isinstance(x, ast.FunctionDef))
    fn.body = _Instrument(start).body(fn.body, [])
    ast.fix_missing_locations(tree)
    rec = _Recorder()
    ns = {"_rec": rec}
    exec(compile(tree, "<instrumented adjoint>", "exec"), ns)
    f = ns[fn.name]
    rng = np.random.default_rng(1)
    params = list(inspect.signature(f).parameters)
    values = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    named = dict(zip(params, args))
    for p in params[len(args):]:
        if p.startswith("_keep_"):       # kept memory (kadj.call_memory): added below
            continue
        if p == "adj_return":
            values.append(1.25)
        elif p.endswith("_buf"):           # a scalar argument's adjoint
            values.append(rng.standard_normal(1))
        else:
            a = named[p[len("adj_"):]]
            values.append(rng.standard_normal(a.shape).astype(a.dtype))
    f(*values, *call_memory.fresh_for(f))
    return rec.bad, rec.saves


def _v(*xs):
    return np.array(xs, dtype=np.float64)


KERNELS = {
    "range_fresh": (range_fresh, lambda n: (_v(0.3, 0.9, 0.4), n, np.zeros(1))),
    "range_break_fresh": (range_break_fresh, lambda n: (_v(0.3, 0.9), n, np.zeros(1))),
    "while_break_fresh": (while_break_fresh, lambda n: (_v(0.3, 0.9), n, np.zeros(1))),
    "nested_fresh": (nested_fresh, lambda n: (_v(0.3, 0.7, 0.2), n, np.zeros(1))),
    "rows_fresh": (rows_fresh, lambda n: (_v(0.3, -0.6, 1.1), n, np.zeros(3))),
}
_DIFF = {}


def _k(name):
    if name not in _DIFF:
        _DIFF[name] = kadj.differentiate(KERNELS[name][0])
    return _DIFF[name]


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_no_save_before_the_first_definition(name):
    k = _k(name)
    make = KERNELS[name][1]
    source = k.compiled(*make(3)).source
    for n in (1, 2, 5):
        bad, saves = first_save_violations(source, make(n))
        assert not bad, (n, bad, source)
        if n > 1:
            assert saves > 0, "the check saw no save at all"


def test_the_first_iteration_saves_nothing_it_did_not_compute():
    # one iteration saves only the value it carries in (s); two iterations save s
    # twice and, once, the value the first iteration defined afresh (t1 = sin(s); t and
    # u, cheap arithmetic of t1, are recomputed from it: kadj.analysis.recompute)
    k = _k("range_fresh")
    source = k.compiled(*KERNELS["range_fresh"][1](1)).source
    _, saves_one = first_save_violations(source, KERNELS["range_fresh"][1](1))
    _, saves_two = first_save_violations(source, KERNELS["range_fresh"][1](2))
    assert saves_one == 1 and saves_two == 3, (saves_one, saves_two, source)


def test_the_check_catches_a_save_of_an_undefined_value():
    src = '''
import numpy as np
def f_adjoint(x, adj_x):
    _tape_f64 = np.empty(8, np.float64)
    _sp_f64 = 0
    t = 0.0
    s = x[0]
    # ---- forward sweep ----
    for i in range(3):
        _tape_f64[_sp_f64] = t
        _sp_f64 += 1
        t = s * 2.0
        _tape_f64[_sp_f64] = s
        _sp_f64 += 1
        s = s + t
'''
    bad, saves = first_save_violations(src, (_v(1.0),))
    assert bad == [("t", 10)] and saves == 6, bad


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("n", [0, 1, 2, 6])
def test_gradient_matches_finite_differences(name, n):
    fd_check(_k(name), KERNELS[name][1](n), rtol=1e-5, atol=1e-8)


SIM_CASES = ["steps_fresh_taped", "steps_fresh_checkpointed", "nested_fresh_taped",
             "nested_fresh_checkpointed"]


@pytest.fixture(scope="module")
def sim_results():
    return run_sim_cases("first_push_cuda_sim.py", SIM_CASES)


@pytest.mark.parametrize("name", SIM_CASES)
def test_cuda_simulator_gradient(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail
