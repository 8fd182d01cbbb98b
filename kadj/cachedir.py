"""kadj's private cache directory: where it is, whether kadj may trust it, and how
entries are read and written without following planted links.

Trust model: the cache directory is trusted exactly as the user's own files are (as
Python's and Numba's ``__pycache__`` are): whoever can write to it can run code as the
user, since the entries are Python modules and Numba's cache files are pickles.  kadj
therefore makes sure that only the user can write to it:

* it creates the directory with mode 0700;
* it refuses (no disk cache, one :class:`CacheWarning`) a directory that is not a
  directory, is owned by another user, or is writable by group or others, and a
  symbolic link to it owned by another user;
* it writes each file with exclusive creation (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
  0600) under an unpredictable temporary name, then renames it into place, so a link
  planted at any name is replaced, never followed;
* it reads entries without following symbolic links and ignores an entry that is not a
  regular file, is owned by another user, or is writable by group or others.

The SHA-256 stored beside an entry detects damage (a partial write, a truncated file);
it is not a signature.  ``KADJ_DISABLE_CACHE=1`` turns the disk cache off.
"""
from __future__ import annotations

import functools
import os
import secrets
import stat
import warnings


class CacheWarning(UserWarning):
    """kadj compiles without its disk cache (the message says why and what to do)."""


_WARNED = set()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def warn_once(message):
    """Issue ``message`` as a :class:`CacheWarning`, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


def disabled():
    return os.environ.get("KADJ_DISABLE_CACHE", "").strip().lower() not in ("", "0", "no",
                                                                           "false")


def configured_dir():
    """``$KADJ_CACHE_DIR``, default ``~/.cache/kadj``."""
    return os.environ.get("KADJ_CACHE_DIR") or os.path.join(os.path.expanduser("~"),
                                                            ".cache", "kadj")


_REMEDY = ("set KADJ_CACHE_DIR to a directory of your own (kadj creates it with mode "
           "0700), or KADJ_DISABLE_CACHE=1 to compile without a disk cache")


def private_dir():
    """The cache directory, created if needed, when kadj may trust it; else None
    (after one :class:`CacheWarning` naming the directory and the reason)."""
    if disabled():
        return None
    d = configured_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError as exc:
        warn_once(f"kadj cannot create its cache directory {d} ({exc.strerror or exc}); "
                  f"adjoints are compiled without a disk cache. To cache them, {_REMEDY}.")
        return None
    problem = untrusted(d)
    if problem:
        warn_once(f"kadj does not use its cache directory {d}: it {problem}, so another "
                  "user could plant code that kadj would run. Adjoints are compiled "
                  f"without a disk cache. To cache them, {_REMEDY}.")
        return None
    return d


def _euid():
    return os.geteuid() if hasattr(os, "geteuid") else None


def untrusted(d):
    """Why directory ``d`` cannot be trusted, or None."""
    try:
        st, lst = os.stat(d), os.lstat(d)
    except OSError as exc:
        return f"cannot be inspected ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    uid = _euid()
    if uid is None:
        return None
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (uid, 0):
        return f"is a symbolic link owned by another user (uid {lst.st_uid})"
    if st.st_uid != uid:
        return f"is owned by another user (uid {st.st_uid}; this process runs as uid {uid})"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("other users", 0o002))
                           if st.st_mode & bit)
        return (f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}; "
                f"'chmod 700 {d}' fixes that)")
    return None


def read_entry(path):
    """The bytes of the cache file ``path``, or None when it is missing, a symbolic
    link, not a regular file, owned by another user or writable by group/others."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        uid = _euid()
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022 or \
                (uid is not None and st.st_uid != uid):
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def write_entry(d, name, data):
    """Write ``data`` to ``d/name``: a fresh 0600 file at an unpredictable name, then
    renamed over ``name`` (a link planted at either name is never followed)."""
    tmp = os.path.join(d, f".{name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
        fd = None
        os.replace(tmp, os.path.join(d, name))
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def njit_cached(fn, options):
    """``(numba.njit(cache=True, **options)(fn), True)``, or ``(njit(**options)(fn),
    False)`` when numba has no writable cache directory for ``fn`` (the cache is
    disabled).

    numba's on-disk cache finds compiled code by signature, machine and bytecode, not by
    the configuration it was compiled under; and numba compiles lazily, at the first
    call, under the environment of that moment.  So the cached code's entries are also
    keyed by that configuration (:func:`kadj.cachekey.numba_config`: bounds checks,
    optimisation level, vectorisation, ...): a process that sets ``NUMBA_BOUNDSCHECK=1``
    after kadj built an adjoint, and compiles it then, stores bounds-checked code that a
    process without bounds checks will not load, and the other way round."""
    from numba import njit
    if not disabled():
        try:
            jitted = njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            warn_once(
                "numba has no writable cache directory for kadj's compiled code (not "
                "beside its source, nor in NUMBA_CACHE_DIR or ~/.cache/numba); it is "
                "compiled in every process instead. Set NUMBA_CACHE_DIR to a writable "
                "directory of your own to cache it.")
        else:
            jitted._cache = _configured_cache_class()(fn)
            return jitted, True
    return njit(**options)(fn), False


@functools.lru_cache(maxsize=None)
def _configured_cache_class():
    from numba.core.caching import CompileResultCacheImpl, FunctionCache

    from .cachekey import numba_config

    class LeanCacheImpl(CompileResultCacheImpl):
        """numba's saving of a compile result, without the text of its type
        annotation (every variable's type beside every source line, which numba
        writes out for ``inspect_types()`` after a reload: about a twentieth of a
        small adjoint's compile): a reloaded function's ``inspect_types()`` says
        where to read its types instead."""

        def reduce(self, cres):
            return super().reduce(cres._replace(type_annotation=_NO_ANNOTATION))

    class ConfiguredCache(FunctionCache):
        """numba's function cache, its entries keyed also by the numba configuration
        read when they are saved or looked up."""
        _impl_class = LeanCacheImpl

        def _index_key(self, sig, codegen):
            return (*super()._index_key(sig, codegen), numba_config())

        # a damaged file of numba's (its index or data unreadable: a truncated
        # write, a file overwritten) is a miss: compiled anew, the index removed so
        # that the save writes a fresh one, never an error of the adjoint call
        def load_overload(self, sig, target_context):
            try:
                return super().load_overload(sig, target_context)
            except Exception as exc:
                self._discard(exc)
                return None

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except Exception as exc:
                self._discard(exc)

        def _discard(self, exc):
            path = getattr(self._cache_file, "_index_path", None)
            warn_once(f"numba's cache file {path} for kadj's compiled code could not be "
                      f"read or written ({type(exc).__name__}: {exc}); it is removed and "
                      "the code compiled anew.")
            try:
                if path:
                    os.remove(path)
            except OSError:
                pass
    return ConfiguredCache


class _NoAnnotation:
    def __str__(self):
        return ("(kadj does not cache the type annotation of its compiled code: "
                "`python -m kadj show` and the adjoint's source (adjoint_source) say "
                "what it computes; KADJ_DISABLE_CACHE=1 compiles it with its "
                "annotation)\n")


_NO_ANNOTATION = _NoAnnotation()


def cached_njit(**options):
    """Decorator form of :func:`njit_cached` (kadj's runtime helpers)."""
    return lambda fn: njit_cached(fn, options)[0]
