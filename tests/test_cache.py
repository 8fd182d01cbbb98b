"""The on-disk adjoint cache ($KADJ_CACHE_DIR, see kadj/codegen.py and README.md).

Every check runs kadj in child processes (same interpreter) against a kernel module
written into a temporary directory, with a private cache directory.  The child wraps
the generator (``kadj.frontend.type_cpu_kernel``, ``kadj.reverse.write_adjoint``,
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
  4. an unusable KADJ_CACHE_DIR falls back to the in-memory cache.
"""
import json
import os
import shutil
import subprocess
import sys
import time

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
import kadj.reverse

counts = {"type": 0, "write": 0, "build": 0, "compile": 0}


def wrap(mod, name, key):
    orig = getattr(mod, name)

    def counted(*a, **k):
        counts[key] += 1
        return orig(*a, **k)

    setattr(mod, name, counted)


wrap(kadj.frontend, "type_cpu_kernel", "type")
wrap(kadj.reverse, "write_adjoint", "write")
wrap(kadj.codegen, "build", "build")
wrap(numba.core.compiler, "compile_extra", "compile")   # what Dispatcher compiles with

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
print("KADJ-RESULT " + json.dumps(dict(
    counts=counts, hits=sum(st.cache_hits.values()), misses=sum(st.cache_misses.values()),
    numba_cache_path=st.cache_path, disk_cached=comp.disk_cached,
    adj_u=adj_u.tolist(), adj_u_new=adj_u_new.tolist(), adj_alpha=adj_alpha.tolist())))
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


def write_kernel(workdir, coef="2.0"):
    path = workdir / "heatmod.py"
    old = path.stat().st_mtime if path.exists() else None
    path.write_text(KERNEL.format(coef=coef))
    if old is not None:  # make the edit visible to mtime checks (kadj's and .pyc's)
        t = max(old, time.time()) + 5.0
        os.utime(path, (t, t))
    (workdir / "child.py").write_text(CHILD)
    return path


def run_child(workdir, cache_dir):
    env = dict(os.environ)
    env["KADJ_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(workdir), KADJ_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.pop("NUMBA_CACHE_DIR", None)       # numba caches next to the adjoint module
    env.pop("NUMBA_DISABLE_JIT", None)
    proc = subprocess.run([sys.executable, str(workdir / "child.py")], cwd=str(workdir),
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
    c = r["counts"]
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


# ---- 3. a damaged cache entry is regenerated ------------------------------------------------
def _valid_prefix(text):
    """A line prefix of the generated module that still compiles and still defines the
    adjoint function, but has lost (at least) the last third of its lines."""
    lines = text.splitlines(keepends=True)
    for k in range(2 * len(lines) // 3, 0, -1):
        prefix = "".join(lines[:k])
        if "\ndef " not in prefix:
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


@pytest.mark.parametrize("damage", sorted(DAMAGE))
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


# numba's own cache files: a truncated index used to raise pickle.UnpicklingError from
# every later adjoint call; kadj now recompiles without numba's cache instead
def test_damaged_numba_cache_file_is_not_fatal(populated, tmp_path):
    src, pristine, first = populated
    assert first["disk_cached"]
    cache = tmp_path / "cache"
    shutil.copytree(pristine, cache)
    index = sorted(cache.rglob("*.nbi"))
    assert index, "no numba cache index next to the adjoint module"
    for p in index:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    r = run_child(src, cache)
    assert_gradient(r, 2.0)


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
