"""Trust checks of kadj's disk cache (see kadj/cachedir.py for the trust model).

The cache directory is trusted as the user's own files are; kadj makes sure nobody else
can write to it and never follows a link planted in it:
  1. a new cache directory is created with mode 0700, its entries with mode 0600;
  2. a symbolic link planted at any name kadj (or numba, beside it) writes is replaced,
     its target never modified;
  3. entries are never read through a symbolic link, nor when owned by another user or
     writable by group/others: the adjoint is regenerated instead;
  4. a directory owned by another user, or writable by group or others, is refused with a
     CacheWarning, and kadj compiles without a disk cache (gradients still right);
  5. a damaged or edited entry (its SHA-256 no longer matches) is regenerated;
  6. KADJ_DISABLE_CACHE=1 turns the disk cache off;
  7. with no writable cache directory at all (kadj installed read-only, HOME,
     KADJ_CACHE_DIR and NUMBA_CACHE_DIR unusable) kadj still works, without a cache,
     and says so once per cause.
Gradients are compared with the analytic derivative (in-process checks) or central
finite differences (the child process).
"""
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import pipeline

KADJ_PKG = os.path.dirname(os.path.abspath(kadj.__file__))
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_UID = 54321
EVIL = "import builtins\nbuiltins.KADJ_TEST_EVIL_RAN = True\n"


@njit
def cubic(x, y):
    for i in range(x.shape[0]):
        y[i] = 0.5 * x[i] * x[i] * x[i]


X = np.linspace(0.5, 1.5, 6)
SEED = np.arange(1.0, 7.0)


def arg_types():
    t = cubic.typeof_pyval(X)
    return (t, t)


def key():
    k = kadj.differentiate(cubic)
    return pipeline.cache_key(k.target, k.request(arg_types()))


def fresh_gradient():
    """A new differentiated kernel (empty in-memory cache): (adj_x, compiled)."""
    k = kadj.differentiate(cubic)
    adj_x = np.zeros_like(X)
    k.adjoint(X, np.zeros_like(X), adj_x, SEED.copy())
    return adj_x, k.compiled(X, np.zeros_like(X))


def assert_right(adj_x, what):
    np.testing.assert_allclose(adj_x, 1.5 * X * X * SEED, rtol=1e-13,
                               err_msg=f"{what}: wrong gradient")


def private(path):
    path.mkdir(parents=True)
    path.chmod(0o700)
    return path


def tree(d):
    """{relative name: (is a link, bytes or link target)} of everything under d."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                out[os.path.relpath(p, d)] = (True, os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, d)] = (False, fh.read())
    return out


@pytest.fixture(autouse=True)
def no_evil():
    import builtins
    builtins.KADJ_TEST_EVIL_RAN = False
    yield
    ran = builtins.KADJ_TEST_EVIL_RAN
    del builtins.KADJ_TEST_EVIL_RAN
    assert not ran, "kadj executed a planted cache entry"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("KADJ_CACHE_DIR", str(d))
    monkeypatch.delenv("KADJ_DISABLE_CACHE", raising=False)
    return d


def populate(d):
    """Fill the private directory ``d`` (adjoint entries and numba's files)."""
    adj_x, comp = fresh_gradient()
    assert_right(adj_x, "populating run")
    assert comp.disk_cached, f"precondition: the adjoint is disk-cached in {d}"
    return tree(d)


# ---- 1. private directory and entries ---------------------------------------------------
def test_new_directory_and_entries_are_private(tmp_path, monkeypatch):
    d = tmp_path / "home" / "kadj"
    monkeypatch.setenv("KADJ_CACHE_DIR", str(d))
    k = kadj.differentiate(cubic)
    assert k.compiled(X, np.zeros_like(X)).disk_cached
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    entries = sorted(d.glob("adj_*"))
    assert len(entries) == 2, entries
    for p in entries:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert not list(d.glob(".*.tmp")) and not list(d.glob("*.tmp")), "temporary files left"


# ---- 2. links planted at the names kadj writes -------------------------------------------
def test_links_planted_at_written_names_are_not_followed(tmp_path, monkeypatch):
    first = private(tmp_path / "first")
    monkeypatch.setenv("KADJ_CACHE_DIR", str(first))
    names = set(populate(first))
    assert any(n.startswith("__pycache__") for n in names), names
    k = key()
    names |= {f"adj_{k}.py.{os.getpid()}.tmp", f"adj_{k}.json.{os.getpid()}.tmp"}

    victims = private(tmp_path / "victims")
    d = private(tmp_path / "cache")
    (d / "__pycache__").mkdir()
    planted = {}
    for i, name in enumerate(sorted(names)):
        if name == "__pycache__":
            continue
        victim = victims / f"victim{i}"
        victim.write_bytes(b"precious %d\n" % i)
        os.symlink(victim, d / name)
        planted[name] = victim
    before = tree(victims)
    monkeypatch.setenv("KADJ_CACHE_DIR", str(d))
    adj_x, comp = fresh_gradient()
    assert_right(adj_x, "run over planted links")
    assert tree(victims) == before, "kadj or numba wrote through a planted link"
    for name in (f"adj_{k}.py", f"adj_{k}.json"):
        assert not os.path.islink(d / name) and (d / name).is_file(), name

    again, _ = fresh_gradient()              # the replaced entries are used normally
    assert_right(again, "second run")
    assert tree(victims) == before


# ---- 3. entries read only when they are the user's own regular files -----------------------
def _forged(d, k, text):
    """The entry pair adj_k.py / adj_k.json of directory ``d`` rewritten with module text
    ``text`` and a matching SHA-256 (as an attacker able to write there would)."""
    import hashlib
    meta = json.loads((d / f"adj_{k}.json").read_text())
    meta["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(meta)


def test_entries_are_never_read_through_links(tmp_path, monkeypatch):
    first = private(tmp_path / "first")
    monkeypatch.setenv("KADJ_CACHE_DIR", str(first))
    populate(first)
    k = key()
    genuine = (first / f"adj_{k}.py").read_text()
    evil_dir = private(tmp_path / "elsewhere")
    (evil_dir / "evil.py").write_text(EVIL + genuine)
    (evil_dir / "evil.json").write_text(_forged(first, k, EVIL + genuine))

    d = private(tmp_path / "cache")
    os.symlink(evil_dir / "evil.py", d / f"adj_{k}.py")
    os.symlink(evil_dir / "evil.json", d / f"adj_{k}.json")
    monkeypatch.setenv("KADJ_CACHE_DIR", str(d))
    adj_x, comp = fresh_gradient()           # no_evil: the planted module never ran
    assert_right(adj_x, "run over linked entries")
    assert not os.path.islink(d / f"adj_{k}.py")
    assert (d / f"adj_{k}.py").read_text() == genuine


@pytest.mark.parametrize("how", ["group_writable", "other_writable", "foreign_owner"])
def test_entries_not_private_to_the_user_are_ignored(cache, how):
    if how == "foreign_owner" and not IS_ROOT:
        pytest.skip("giving a file to another user needs root")
    private(cache)
    populate(cache)
    k = key()
    src = cache / f"adj_{k}.py"
    text = EVIL + src.read_text()
    meta = _forged(cache, k, text)
    src.write_text(text)
    (cache / f"adj_{k}.json").write_text(meta)
    if how == "group_writable":
        src.chmod(0o620)
    elif how == "other_writable":
        src.chmod(0o602)
    else:
        os.chown(src, OTHER_UID, OTHER_UID)
    adj_x, comp = fresh_gradient()
    assert_right(adj_x, f"run over a {how} entry")
    st = src.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600, \
        "the refused entry was not replaced by a regenerated one"
    assert not src.read_text().startswith(EVIL)


# ---- 4. directories kadj refuses -----------------------------------------------------------
@pytest.mark.parametrize("how", ["group_writable", "other_writable", "foreign_owner",
                                 "foreign_link"])
def test_untrusted_directory_is_refused(cache, tmp_path, how):
    from kadj.cachedir import CacheWarning
    if how.startswith("foreign") and not IS_ROOT:
        pytest.skip("giving a directory to another user needs root")
    if how == "foreign_link":
        target = private(tmp_path / "target")
        os.symlink(target, cache)
        os.lchown(cache, OTHER_UID, OTHER_UID)
        watched, reason = target, "symbolic link owned by another user"
    else:
        private(cache)
        watched = cache
        if how == "group_writable":
            cache.chmod(0o770)
            reason = "writable by its group"
        elif how == "other_writable":
            cache.chmod(0o703)
            reason = "writable by other users"
        else:
            os.chown(cache, OTHER_UID, OTHER_UID)
            reason = "owned by another user"
    with pytest.warns(CacheWarning, match=reason) as record:
        adj_x, comp = fresh_gradient()
    assert_right(adj_x, f"run with a {how} cache directory")
    assert not comp.disk_cached
    assert any(str(cache) in str(w.message) for w in record)
    assert tree(watched) == {}, "kadj wrote into a directory it does not trust"


# ---- 5. damage and edits ---------------------------------------------------------------------
def test_entry_edited_without_its_checksum_is_regenerated(cache):
    """The SHA-256 in the record detects damage.  It is not a signature: the private
    directory is trusted as the user's own files are (see kadj/cachedir.py)."""
    private(cache)
    populate(cache)
    src = cache / f"adj_{key()}.py"
    genuine = src.read_text()
    src.write_text(EVIL + genuine)
    adj_x, comp = fresh_gradient()
    assert_right(adj_x, "run over an edited entry")
    assert comp.disk_cached and src.read_text() == genuine


# ---- 6. disabled -------------------------------------------------------------------------
def test_disable_cache(cache, monkeypatch):
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        comp = kadj.differentiate(cubic).compiled(X, np.zeros_like(X))
    assert not comp.disk_cached
    assert not cache.exists()
    assert not [w for w in record if w.category.__name__ == "CacheWarning"], \
        "a disabled cache is not worth a warning"


# ---- 7. no writable cache directory at all ------------------------------------------------
CHILD = """\
import json
import math
import warnings

import numpy as np
from numba import njit

warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    import kadj

    @njit
    def chain(x):
        s = 1.0
        for i in range(x.shape[0]):
            s = math.sin(s) * x[i] + 0.5 * s
        return s

    x = np.linspace(0.6, 1.4, 7)
    grads = []
    for _ in range(2):  # two kernels, two builds: each warning only once
        k = kadj.differentiate(chain)
        g = np.zeros_like(x)
        k.adjoint(x, g)
        grads.append(g.tolist())
        disk = k.compiled(x).disk_cached
print("KADJ-RESULT " + json.dumps(dict(
    grads=grads, disk=disk,
    warnings=[[w.category.__name__, str(w.message)] for w in record])))
"""


def chain_py(x):
    s = 1.0
    for i in range(x.shape[0]):
        s = math.sin(s) * x[i] + 0.5 * s
    return s


def unusable(base, name):
    """A directory path nobody can create or write: a path under a regular file (root
    writes anywhere), or a read-only directory for other users."""
    if IS_ROOT:
        blocker = base / "blocker"
        if not blocker.exists():
            blocker.write_text("a file, not a directory\n")
        return blocker / name
    d = base / name
    d.mkdir()
    d.chmod(0o500)
    return d


def test_no_writable_cache_directory_anywhere(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(KADJ_PKG, site / "kadj", ignore=shutil.ignore_patterns("__pycache__"))
    for pkg in [site / "kadj"] + [p for p in (site / "kadj").rglob("*") if p.is_dir()]:
        (pkg / "__pycache__").write_text("")     # nothing can be written beside kadj
    if not IS_ROOT:
        for p in [site / "kadj"] + list((site / "kadj").rglob("*")):
            p.chmod(p.stat().st_mode & ~0o222)
    src = tmp_path / "src"
    src.mkdir()
    (src / "child.py").write_text(CHILD)
    installed = tree(site)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KADJ_", "NUMBA_", "XDG_"))}
    env.update(HOME=str(unusable(tmp_path, "home")),
               KADJ_CACHE_DIR=str(unusable(tmp_path, "kadj_cache")),
               NUMBA_CACHE_DIR=str(unusable(tmp_path, "numba_cache")),
               PYTHONPATH=os.pathsep.join([str(site), str(src)]),
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, str(src / "child.py")], cwd=str(src), env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (
        f"kadj failed without a writable cache directory (rc={proc.returncode})\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("KADJ-RESULT ")][-1]
    r = json.loads(line[len("KADJ-RESULT "):])

    x = np.linspace(0.6, 1.4, 7)
    h = 1e-6
    fd = np.array([(chain_py(x + h * e) - chain_py(x - h * e)) / (2 * h)
                   for e in np.eye(x.size)])
    for g in r["grads"]:
        np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)
    assert not r["disk"]
    cache_warnings = [m for c, m in r["warnings"] if c == "CacheWarning"]
    assert any(env["KADJ_CACHE_DIR"] in m for m in cache_warnings), r["warnings"]
    assert len(cache_warnings) == len(set(cache_warnings)), \
        f"a cache warning was repeated: {cache_warnings}"
    assert tree(site) == installed, "something was written into the installed package"
