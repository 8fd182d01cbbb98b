"""The on-disk adjoint cache ($KADJ_CACHE_DIR, see kadj/codegen.py and README.md).

Every check runs kadj in child processes (same interpreter) against a kernel module
written into a temporary directory, with a private cache directory.  The child wraps
the generator (``kadj.frontend.type_cpu_kernel``, ``kadj.reverse.build_adjoint``,
``kadj.codegen.build``) and numba's compiler (``numba.core.compiler.compile_extra``)
with counters, runs ``heat_step.adjoint(...)`` once and prints, as one JSON line, the
counters, numba's cache statistics of the jitted adjoint (``Dispatcher.stats``:
``cache_hits`` / ``cache_misses`` are Counters keyed by signature) and the gradient.

Contract checked here:
  1. a second process with unchanged sources neither regenerates the adjoint (no
     generator calls) nor recompiles it (no numba compile, a numba cache hit), and
     gives bit-identical gradients;
  2. editing the kernel's source makes the next process regenerate, with the new
     gradient;
  3. a damaged cache entry (.py or .json) is regenerated, never an error and never a
     wrong gradient;
  4. an unusable KADJ_CACHE_DIR falls back to the in-memory cache;
  5. what the adjoint depends on beyond the kernel's source is in the key: a constant
     read through another module (``consts.SCALE``, in a new process and after
     ``importlib.reload``), a jitted helper of another module edited in place (its
     modification time kept), numba's configuration, the versions of kadj, Python,
     NumPy, Numba and llvmlite, and the jit options.

The trust checks on the directory and its entries are in test_cache_safety.py.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import types as types_module

import numpy as np
import pytest

import kadj

# The children import the same kadj as this process.
KADJ_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kadj.__file__)))

KERNEL = """\
from numba import njit
import kadj


@kadj.differentiate
@njit
def heat_step(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - {coef} * u[i] + u[i + 1])
"""

CHILD = """\
import json

import numpy as np
import numba.core.compiler

import kadj
import kadj.codegen
import kadj.frontend
import kadj.cpu_gather
import kadj.reverse

counts = {"type": 0, "write": 0, "build": 0, "compile": 0, "sources": 0}


def wrap(mod, name, key):
    orig = getattr(mod, name)

    def counted(*a, **k):
        counts[key] += 1
        return orig(*a, **k)

    setattr(mod, name, counted)


wrap(kadj.frontend, "type_cpu_kernel", "type")
wrap(kadj.reverse, "build_adjoint", "write")
wrap(kadj.cpu_gather, "build_gather_adjoint", "write")   # a stencil's gather form
wrap(kadj.codegen, "build", "build")
wrap(numba.core.compiler, "compile_extra", "compile")   # what Dispatcher compiles with
import kadj.cache_lines
wrap(kadj.cache_lines, "_functions", "sources")   # a moved entry's kernel source read

import heatmod

n = 12
u = np.linspace(0.0, 1.0, n) ** 2
u_new = np.zeros(n)
alpha = 0.1
adj_u = np.zeros(n)
adj_u_new = np.arange(1.0, n + 1.0)
adj_alpha = np.zeros(1)
heatmod.heat_step.adjoint(u, u_new, alpha, adj_u, adj_u_new, adj_alpha)
comp = heatmod.heat_step.compiled(u, u_new, alpha)
st = comp.function.stats
import re
shown = sorted({int(m) for m in re.findall(r"heatmod\\.py:(\\d+)", comp.source)})
print("KADJ-RESULT " + json.dumps(dict(
    counts=counts, hits=sum(st.cache_hits.values()), misses=sum(st.cache_misses.values()),
    numba_cache_path=st.cache_path, disk_cached=comp.disk_cached,
    shown_lines=shown, annotation=str(next(iter(
        comp.function.overloads.values())).type_annotation)[:200], adj_u=adj_u.tolist(), adj_u_new=adj_u_new.tolist(), adj_alpha=adj_alpha.tolist())))
"""

N = 12


def expected(coef):
    """Hand-derived adjoint of heat_step with the seed the child uses."""
    u = np.linspace(0.0, 1.0, N) ** 2
    alpha = 0.1
    g = np.arange(1.0, N + 1.0)
    adj_u = np.zeros(N)
    adj_alpha = 0.0
    for i in range(1, N - 1):
        adj_u[i - 1] += alpha * g[i]
        adj_u[i] += (1.0 - coef * alpha) * g[i]
        adj_u[i + 1] += alpha * g[i]
        adj_alpha += g[i] * (u[i - 1] - coef * u[i] + u[i + 1])
    adj_u_new = g.copy()
    adj_u_new[1:-1] = 0.0          # overwritten elements: cotangent consumed
    return adj_u, adj_u_new, np.array([adj_alpha])


def write_kernel(workdir, coef="2.0", above="", below=""):
    path = workdir / "heatmod.py"
    old = path.stat().st_mtime if path.exists() else None
    path.write_text(above + KERNEL.format(coef=coef) + below)
    if old is not None:  # make the edit visible to mtime checks (kadj's and .pyc's)
        t = max(old, time.time()) + 5.0
        os.utime(path, (t, t))
    (workdir / "child.py").write_text(CHILD)
    return path


def run_child(workdir, cache_dir, script="child.py", args=(), env_extra=None):
    """Run ``script`` of ``workdir`` in a fresh interpreter with KADJ_CACHE_DIR=cache_dir
    (and ``env_extra``); the parsed JSON of its KADJ-RESULT line."""
    env = dict(os.environ)
    env["KADJ_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(workdir), KADJ_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"   # edits within one second: never a stale .pyc
    for name in ("NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT", "NUMBA_BOUNDSCHECK",
                 "KADJ_DISABLE_CACHE"):
        env.pop(name, None)                # numba caches next to the adjoint module
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, str(workdir / script), *args], cwd=str(workdir),
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (
        f"child process failed (rc={proc.returncode}) with KADJ_CACHE_DIR={cache_dir}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("KADJ-RESULT ")]
    assert lines, f"no result line\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return json.loads(lines[-1][len("KADJ-RESULT "):])


def grads(r):
    return np.array(r["adj_u"]), np.array(r["adj_u_new"]), np.array(r["adj_alpha"])


def assert_gradient(r, coef):
    for got, want, name in zip(grads(r), expected(coef), ("adj_u", "adj_u_new", "adj_alpha")):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14,
                                   err_msg=f"{name} (coefficient {coef})")


def assert_generated(r, what):
    c = r["counts"]
    assert c["type"] > 0 and c["write"] > 0 and c["build"] > 0, (
        f"{what}: expected kadj to regenerate the adjoint, counters {c}")
    assert c["compile"] > 0 or r["hits"] > 0, f"{what}: adjoint neither compiled nor loaded"


def assert_from_cache(r, what):
    c = {k: v for k, v in r["counts"].items() if k != "sources"}
    assert c == {"type": 0, "write": 0, "build": 0, "compile": 0}, (
        f"{what}: expected neither regeneration nor compilation, counters {c} "
        f"(disk_cached={r['disk_cached']}, numba hits={r['hits']} misses={r['misses']})")
    assert r["hits"] >= 1 and r["misses"] == 0, (
        f"{what}: expected numba to load the adjoint from its cache, "
        f"hits={r['hits']} misses={r['misses']}")


def cache_entries(cache_dir):
    return (sorted(cache_dir.glob("adj_*.py")), sorted(cache_dir.glob("adj_*.json")))


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    write_kernel(d)
    return d


# ---- 1. a second process neither regenerates nor recompiles ---------------------------------
def test_second_process_neither_regenerates_nor_recompiles(workdir, tmp_path):
    cache = tmp_path / "cache"
    first = run_child(workdir, cache)
    assert_generated(first, "first process")
    assert first["disk_cached"], (
        "the heat-step adjoint was not written to the disk cache (memory-only); "
        f"cache dir holds {sorted(p.name for p in cache.glob('*')) if cache.exists() else []}")
    assert first["counts"]["compile"] >= 1 and first["misses"] >= 1 and first["hits"] == 0
    pys, jsons = cache_entries(cache)
    assert len(pys) == 1 and len(jsons) == 1, (pys, jsons)
    assert first["numba_cache_path"] and \
        os.path.realpath(first["numba_cache_path"]).startswith(os.path.realpath(cache))
    assert_gradient(first, 2.0)

    second = run_child(workdir, cache)
    assert second["disk_cached"]
    assert_from_cache(second, "second process")
    # numba's type annotation in the process that compiled; not written to the cache
    assert first["annotation"].startswith("# File:"), first["annotation"]
    assert "kadj does not cache the type annotation" in second["annotation"], \
        second["annotation"]
    assert grads(second)[0].tobytes() == grads(first)[0].tobytes()
    assert grads(second)[1].tobytes() == grads(first)[1].tobytes()
    assert grads(second)[2].tobytes() == grads(first)[2].tobytes()


# ---- 2. editing the kernel's source regenerates ---------------------------------------------
def test_edited_kernel_source_is_regenerated(workdir, tmp_path):
    cache = tmp_path / "cache"
    before = run_child(workdir, cache)
    assert_gradient(before, 2.0)

    write_kernel(workdir, coef="3.0")        # same size, later mtime
    edited = run_child(workdir, cache)
    assert_generated(edited, "process after the edit")
    assert_gradient(edited, 3.0)
    assert not np.allclose(grads(edited)[0], grads(before)[0])

    again = run_child(workdir, cache)        # the regenerated entry is cached in turn
    assert_from_cache(again, "process after the edit, second run")
    assert_gradient(again, 3.0)


def kernel_lines(workdir):
    """Line numbers of heat_step's ``for`` and assignment in heatmod.py now."""
    text = (workdir / "heatmod.py").read_text().splitlines()
    return [k + 1 for k, ln in enumerate(text) if "for i in" in ln or "u_new[i] =" in ln]


def test_edits_elsewhere_in_the_file_keep_the_entry(workdir, tmp_path):
    """Lines added above the kernel and a function edited below it: the kernel's code is
    unchanged, so the entry is used as it is (no generation, a numba cache hit) and the
    source kadj shows names the kernel's new line numbers."""
    cache = tmp_path / "cache"
    before = run_child(workdir, cache)
    assert set(kernel_lines(workdir)) <= set(before["shown_lines"])

    write_kernel(workdir, above="# a comment\nSCALE = 2.0\n\n\ndef other(a):\n"
                 "    return a + 1\n\n", below="\n\ndef later(b):\n    return b * 3\n")
    moved = run_child(workdir, cache)
    assert_from_cache(moved, "process after edits outside the kernel")
    assert_gradient(moved, 2.0)
    now = kernel_lines(workdir)
    assert now[0] == kernel_lines_before(before) + 7
    assert set(now) <= set(moved["shown_lines"]), (now, moved["shown_lines"])
    assert min(moved["shown_lines"]) >= 8, moved["shown_lines"]

    write_kernel(workdir, coef="2.0", above="# a comment\n\n\n\n\n\n\n",
                 below="\n\ndef later(b):\n    return b * 3\n")
    (workdir / "heatmod.py").write_text(
        (workdir / "heatmod.py").read_text().replace("    for i in", "    # one step\n    for i in"))
    t = time.time() + 10.0
    os.utime(workdir / "heatmod.py", (t, t))
    commented = run_child(workdir, cache)   # a line of the kernel changed: regenerated
    assert_generated(commented, "process after a comment inside the kernel")
    assert_gradient(commented, 2.0)


def _record(cache):
    (path,) = cache.glob("adj_*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_moved_kernel_record_is_rewritten(workdir, tmp_path):
    """The kernel moved down in its file: the first load finds where (reading its
    source) and rewrites the entry's record, so the next load reads no source; both
    show the new lines, and a second move is found from the entry's own lines."""
    cache = tmp_path / "cache"
    first = run_child(workdir, cache)
    assert_gradient(first, 2.0)
    written = _record(cache)
    assert "line_moves" not in written
    py_before = [p.read_bytes() for p in cache.glob("adj_*.py")]

    for shift in (9, 4):
        write_kernel(workdir, above="# moved\n" * shift)
        mtime = os.path.getmtime(workdir / "heatmod.py")
        moved = run_child(workdir, cache)
        assert_from_cache(moved, f"first process after moving the kernel by {shift}")
        assert moved["counts"]["sources"] >= 1, moved["counts"]
        assert_gradient(moved, 2.0)
        assert min(moved["shown_lines"]) == kernel_lines_before(first) + shift
        assert set(kernel_lines(workdir)) <= set(moved["shown_lines"])
        rec = _record(cache)
        assert rec["kernel_lines"] == written["kernel_lines"]   # the text's own lines
        assert [m[2] for m in rec["line_moves"][str(workdir / "heatmod.py")]] == [shift]
        assert dict(rec["files"])[str(workdir / "heatmod.py")] == mtime

        again = run_child(workdir, cache)
        assert_from_cache(again, f"second process after moving the kernel by {shift}")
        assert again["counts"]["sources"] == 0, again["counts"]
        assert_gradient(again, 2.0)
        assert grads(again)[0].tobytes() == grads(first)[0].tobytes()
        assert again["shown_lines"] == moved["shown_lines"]
    # the module file, and so numba's cache of it, is the one first written
    assert [p.read_bytes() for p in cache.glob("adj_*.py")] == py_before


def kernel_lines_before(r):
    return min(r["shown_lines"])


# ---- 3. a damaged cache entry is regenerated ------------------------------------------------
def _valid_prefix(text):
    """A line prefix of the generated module that still compiles and still defines the
    adjoint function, but has lost (at least) the last third of its lines."""
    lines = text.splitlines(keepends=True)
    for k in range(2 * len(lines) // 3, 0, -1):
        prefix = "".join(lines[:k])
        if "\ndef " not in "\n" + prefix:   # the module may begin with the def
            break
        try:
            compile(prefix, "<prefix>", "exec")
        except SyntaxError:
            continue
        return prefix
    pytest.fail("no syntactically valid prefix of the generated adjoint module")


DAMAGE = {
    "py_empty": ("py", lambda text: ""),
    "py_half_bytes": ("py", lambda text: text[: len(text) // 2]),
    "py_valid_prefix": ("py", _valid_prefix),   # imports fine, function body cut short
    "json_empty": ("json", lambda text: ""),
    "json_half_bytes": ("json", lambda text: text[: len(text) // 2]),
}


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A kernel directory and a cache directory filled by one child process."""
    base = tmp_path_factory.mktemp("populated")
    src = base / "src"
    src.mkdir()
    write_kernel(src)
    cache = base / "cache"
    r = run_child(src, cache)
    assert_gradient(r, 2.0)
    return src, cache, r


@pytest.mark.parametrize("damage", [d if i % 3 == 0 else pytest.param(d, marks=pytest.mark.slow)
                                    for i, d in enumerate(sorted(DAMAGE))])   # the rest: -m slow
def test_damaged_cache_entry_is_regenerated(populated, tmp_path, damage):
    src, pristine, first = populated
    assert first["disk_cached"], "precondition: the adjoint is disk-cached (see test 1)"
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)         # same kernel path -> same cache key
    kind, damage_fn = DAMAGE[damage]
    (target,) = cache.glob(f"adj_*.{kind}")
    target.write_text(damage_fn(target.read_text()))

    r = run_child(src, cache)
    assert_gradient(r, 2.0)                  # first: never a silently wrong gradient
    assert_generated(r, f"process after damage {damage}")
    assert r["disk_cached"]

    again = run_child(src, cache)            # the rewritten entry is good again
    assert_from_cache(again, f"second process after damage {damage}")
    assert_gradient(again, 2.0)


# numba's own cache files: a truncated index used to raise pickle.UnpicklingError, and
# one overwritten with text a raw ValueError, from every later adjoint call; a damaged
# file is now a miss (kadj.cachedir: removed, compiled anew, one CacheWarning), and the
# next process loads the fresh one
@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_damaged_numba_cache_file_is_not_fatal(populated, tmp_path, damage):
    src, pristine, first = populated
    assert first["disk_cached"]
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    index = sorted(cache.rglob("*.nbi"))
    assert index, "no numba cache index next to the adjoint module"
    for p in index:
        if damage == "truncated":
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        else:
            p.write_text("garbage\n")
    r = run_child(src, cache)
    assert_gradient(r, 2.0)
    again = run_child(src, cache)
    assert_gradient(again, 2.0)
    assert again["hits"] >= 1 and again["misses"] == 0, again


# ---- 4. an unusable cache directory falls back to memory ------------------------------------
@pytest.mark.parametrize("where", ["is_a_file", "under_a_file"])
def test_unwritable_cache_dir_falls_back_to_memory(workdir, tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    cache = blocker if where == "is_a_file" else blocker / "kadj" / "cache"
    r = run_child(workdir, cache)
    assert_gradient(r, 2.0)
    assert not r["disk_cached"]
    assert_generated(r, "process with an unusable cache dir")
    assert blocker.is_file() and blocker.read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "src"]


# ---- 5. dependencies beyond the kernel's own source -----------------------------------------
STALE_KERNEL = """\
from numba import njit
import kadj
import consts
import helpers


@kadj.differentiate
@njit
def scaled(x, y):
    for i in range(x.shape[0]):
        y[i] = consts.SCALE * helpers.square(x[i])
"""

STALE_HELPERS = """\
from numba import njit


@njit
def square(v):
    return {c} * v * v
"""

STALE_CHILD = """\
import importlib
import json
import sys

import numpy as np

import kadj.codegen

builds = [0]
_build = kadj.codegen.build


def counted(*a, **k):
    builds[0] += 1
    return _build(*a, **k)


kadj.codegen.build = counted

import consts
import stalemod


def run():
    builds[0] = 0
    x = np.linspace(0.5, 1.5, 5)
    adj_x, adj_y = np.zeros(5), np.arange(1.0, 6.0)
    stalemod.scaled.adjoint(x, np.zeros(5), adj_x, adj_y)
    comp = stalemod.scaled.compiled(x, np.zeros(5))
    return dict(adj_x=adj_x.tolist(), builds=builds[0], disk_cached=comp.disk_cached)


out = [run()]
if len(sys.argv) > 1:            # a new SCALE, reloaded in this same process
    with open("consts.py", "w") as fh:
        fh.write(f"SCALE = {sys.argv[1]}\\n")
    importlib.reload(consts)
    importlib.reload(stalemod)   # re-decorates the kernel
    out.append(run())
print("KADJ-RESULT " + json.dumps(out))
"""


def write_stale_sources(d, scale, c, keep_mtime=False):
    """consts.py (SCALE), helpers.py (square = c * v * v), stalemod.py, the child."""
    for name, text in (("consts.py", f"SCALE = {scale}\n"),
                       ("helpers.py", STALE_HELPERS.format(c=c)),
                       ("stalemod.py", STALE_KERNEL), ("stale_child.py", STALE_CHILD)):
        path = d / name
        old = path.stat() if path.exists() else None
        if old is not None and path.read_text() == text:
            continue
        path.write_text(text)
        if old is not None:
            t = old.st_mtime_ns if keep_mtime else old.st_mtime_ns + 5_000_000_000
            os.utime(path, ns=(t, t))


def assert_scaled_gradient(r, scale, c, what):
    """d/dx of y = scale * c * x**2, seeded with adj_y = 1..5."""
    x = np.linspace(0.5, 1.5, 5)
    want = scale * 2.0 * c * x * np.arange(1.0, 6.0)
    np.testing.assert_allclose(np.array(r["adj_x"]), want, rtol=1e-13, err_msg=(
        f"{what}: the adjoint does not use SCALE={scale}, square = {c} * v * v "
        f"(builds={r['builds']}, disk_cached={r['disk_cached']})"))


def test_constant_read_through_a_module_is_in_the_key(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    write_stale_sources(src, "2.0", "1.0")
    first = run_child(src, cache, "stale_child.py")[0]
    assert_scaled_gradient(first, 2.0, 1.0, "first process")
    assert first["disk_cached"] and first["builds"] == 1

    write_stale_sources(src, "5.0", "1.0")   # consts.py edited, the kernel's file is not
    second = run_child(src, cache, "stale_child.py")[0]
    assert_scaled_gradient(second, 5.0, 1.0, "process after consts.SCALE = 5.0")
    assert second["builds"] == 1, "the adjoint for SCALE=5.0 was not regenerated"

    # a third process: the SCALE=5.0 adjoint from the disk cache, then SCALE=7.0 by
    # importlib.reload of both modules in the same process
    third, reloaded = run_child(src, cache, "stale_child.py", args=["7.0"])
    assert_scaled_gradient(third, 5.0, 1.0, "third process, before the reload")
    assert third["builds"] == 0, "an unchanged kernel was regenerated: the key is unstable"
    assert_scaled_gradient(reloaded, 7.0, 1.0, "after importlib.reload (SCALE = 7.0)")
    assert reloaded["builds"] == 1


def test_helper_edited_in_place_is_in_the_key(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    write_stale_sources(src, "2.0", "1.0")
    first = run_child(src, cache, "stale_child.py")[0]
    assert_scaled_gradient(first, 2.0, 1.0, "first process")
    assert first["disk_cached"]

    # same size, same modification time: only the helper's code tells the versions apart
    write_stale_sources(src, "2.0", "3.0", keep_mtime=True)
    second = run_child(src, cache, "stale_child.py")[0]
    assert_scaled_gradient(second, 2.0, 3.0, "process after editing helpers.square")
    assert second["builds"] == 1


def test_numba_config_change_is_in_the_key(populated, tmp_path):
    src, pristine, first = populated
    assert first["disk_cached"]
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    r = run_child(src, cache, env_extra={"NUMBA_BOUNDSCHECK": "1"})
    assert_generated(r, "process with NUMBA_BOUNDSCHECK=1 after one without")
    assert_gradient(r, 2.0)


def test_code_compiled_under_a_later_numba_config_is_not_served_to_another(workdir,
                                                                          tmp_path):
    """numba compiles at the first call, under the environment of that moment: a
    process that builds the adjoint, then sets NUMBA_BOUNDSCHECK=1 and calls it, stores
    bounds-checked code.  A process without bounds checks does not load that code
    (numba's cache entries are keyed by the configuration too): it compiles its own,
    which the next such process loads."""
    write_kernel(workdir)
    late = CHILD.replace(
        "heatmod.heat_step.adjoint(u, u_new, alpha, adj_u, adj_u_new, adj_alpha)",
        "heatmod.heat_step.compiled(u, u_new, alpha)\n"
        "import os\nos.environ['NUMBA_BOUNDSCHECK'] = '1'\n"
        "heatmod.heat_step.adjoint(u, u_new, alpha, adj_u, adj_u_new, adj_alpha)")
    assert late != CHILD
    (workdir / "child_late.py").write_text(late)
    cache = tmp_path / "cache"
    a = run_child(workdir, cache, script="child_late.py")
    assert a["misses"] == 1 and a["hits"] == 0 and a["disk_cached"]
    b = run_child(workdir, cache)
    assert b["counts"]["type"] == 0 and b["counts"]["build"] == 0   # kadj's entry reused
    assert b["misses"] == 1 and b["hits"] == 0, b    # numba's bounds-checked code: not
    c = run_child(workdir, cache)
    assert c["hits"] == 1 and c["misses"] == 0, c
    for r in (a, b, c):
        assert_gradient(r, 2.0)


def _key(fn, options=None):
    from numba.core import types

    from kadj import codegen
    arr = types.Array(types.float64, 1, "C")
    return codegen.cache_key(fn, (arr, arr), None, options or {}, "cpu")


def _plain(x, y):
    for i in range(x.shape[0]):
        y[i] = 2.0 * x[i]


def test_key_covers_versions_configuration_and_options(monkeypatch):
    import llvmlite
    import numba

    base = _key(_plain)
    assert not base.startswith("mem-") and _key(_plain) == base, "the key is not stable"
    changes = [(kadj, "__version__", "99.0"), (numba, "__version__", "0.1"),
               (np, "__version__", "0.1"), (llvmlite, "__version__", "0.1"),
               (sys, "version", "3.99.0 (elsewhere)"),
               (numba.config, "BOUNDSCHECK", 1 if numba.config.BOUNDSCHECK != 1 else 0),
               (numba.config, "OPT", 0), (numba.config, "CPU_NAME", "some-other-cpu"),
               (numba.config, "LOOP_VECTORIZE", not numba.config.LOOP_VECTORIZE),
               (numba.config, "DISABLE_INTEL_SVML", not numba.config.DISABLE_INTEL_SVML)]
    for obj, attr, value in changes:
        with monkeypatch.context() as m:
            m.setattr(obj, attr, value)
            assert _key(_plain) != base, f"the key ignores {getattr(obj, '__name__', obj)}.{attr}"
    assert _key(_plain) == base
    keys = {_key(_plain, o) for o in ({}, {"fastmath": True}, {"error_model": "numpy"},
                                      {"error_model": "python"}, {"boundscheck": True},
                                      {"fastmath": {"nnan"}}, {"fastmath": {"nnan", "ninf"}})}
    assert len(keys) == 7, "two different jit options share a key"
    # option sets are keyed by content, not by their (hash-randomised) order
    assert _key(_plain, {"fastmath": {"nnan", "ninf", "arcp"}}) == \
        _key(_plain, {"fastmath": {"arcp", "ninf", "nnan"}})


class _Opaque:
    scale = 2.0


_OPAQUE = _Opaque()


def _reads_opaque(x, y):
    for i in range(x.shape[0]):
        y[i] = _OPAQUE.scale * x[i]


def test_values_without_a_stable_description_keep_the_adjoint_in_memory():
    assert _key(_reads_opaque).startswith("mem-")
    from kadj import codegen
    assert codegen.load_cached(_key(_reads_opaque)) is None


_consts = types_module.ModuleType("kadj_test_consts")
_consts.SCALE = 3.0


def _reads_module(x, y):
    for i in range(x.shape[0]):
        y[i] = _consts.SCALE * x[i]


def test_value_the_key_missed_keeps_the_adjoint_in_memory(monkeypatch, tmp_path):
    """The typed IR is checked against the key: a frozen value the key's walk did not
    take in (here: a walk that stops following module attributes) is never cached."""
    from numba import njit

    from kadj import cachekey
    cache = tmp_path / "cache"
    monkeypatch.setenv("KADJ_CACHE_DIR", str(cache))
    kernel = njit(_reads_module)
    x = np.linspace(0.5, 1.5, 4)
    assert kadj.differentiate(kernel).compiled(x, np.zeros(4)).disk_cached, \
        "precondition: with the full walk the adjoint is disk-cached"
    written = sorted(cache.glob("adj_*"))

    monkeypatch.setattr(cachekey.Fingerprint, "_module",
                        lambda self, mod, names, depth: self.text("module", mod.__name__))
    k = kadj.differentiate(kernel)
    assert not k.compiled(x, np.zeros(4)).disk_cached
    assert sorted(cache.glob("adj_*")) == written
    adj_x = np.zeros(4)
    k.adjoint(x, np.zeros(4), adj_x, np.arange(1.0, 5.0))
    np.testing.assert_allclose(adj_x, 3.0 * np.arange(1.0, 5.0), rtol=1e-14)
