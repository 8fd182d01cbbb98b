"""Atomics and instruction counts in the PTX of CUDA adjoints, kadj's and hand-written.

Runs anywhere numba-cuda can compile PTX (NVVM; no GPU needed).  For every case in
``perf/cases_cuda.py`` it compiles kadj's adjoint (``kernel.adjoint_ptx``) and the
hand-written adjoint's kernels (``numba.cuda.compile_ptx``) for one compute capability,
and for every case in the gallery modules ``kernels/cuda/*.py`` (module-level ``CASES``
of objects with ``.name``, ``.kernel``, ``.config`` and ``.make_args(rng)``), when that
package exists, kadj's adjoint alone.  It counts the atomic instructions (``atom.*`` and
``red.*`` lines) by memory space, operation and type, counts instructions, and prints a
table beside kadj's own account of each accumulation (``kernel.adjoint_report``).

Usage::

    python scripts/ptx_report.py                  # table
    python scripts/ptx_report.py --json out.json  # also write the records
    python scripts/ptx_report.py --cc 8 0 --no-gallery --cases heat2d spmv
    python scripts/ptx_report.py --sass           # also registers and SASS per kernel

``--sass`` assembles each kernel's PTX with ``ptxas`` (on PATH, or the one the
``nvidia-cuda-nvcc`` wheel of numba-cuda's ``cu12`` extra brings; still no GPU) and
reports its registers per thread, spilled bytes and SASS instructions (the size of its
code section over 16 bytes), with the forward kernel's beside the adjoints' for the
perf cases.

Exits with status 1 when a compilation fails for a reason other than kadj refusing the
kernel with a ``DifferentiationError`` (reported in the table as ``refused``); failures
are reported as ``ERROR`` with the first line of the message (``--traceback`` for more).
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import pkgutil
import re
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/, kernels/ and kadj/ live here
    sys.path.insert(0, str(ROOT))

_ATOMIC = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:atom|red)\.[\w.]+)")
_SPACES = ("global", "shared", "shared::cta", "shared::cluster")
_SEMS = {"relaxed", "acquire", "release", "acq_rel", "sys", "gpu", "cta", "cluster"}


# --------------------------------------------------------------------------------------
# PTX analysis
# --------------------------------------------------------------------------------------


def atomic_lines(ptx):
    """The atomic instructions of ``ptx`` (``atom.`` and ``red.``), one opcode each."""
    out = []
    for line in ptx.splitlines():
        m = _ATOMIC.match(line)
        if m:
            out.append(m.group(1))
    return out


def classify_atomic(opcode):
    """``"atom.global.add.f64"`` -> ``("global", "add.f64")``; generic addressing (no
    space in the opcode) is ``"generic"``."""
    parts = opcode.split(".")[1:]
    space = "generic"
    rest = []
    for p in parts:
        if p in _SPACES or p.startswith("shared"):
            space = "shared" if p.startswith("shared") else p
        elif p not in _SEMS:
            rest.append(p)
    return space, ".".join(rest)


def count_instructions(ptx):
    """Number of PTX instructions (statements ending in ``;`` that are not directives)."""
    n = 0
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "{", "}")) or s.endswith(":"):
            continue
        if s.endswith(";"):
            n += 1
    return n


def find_ptxas():
    """The path of ``ptxas``, or None."""
    import shutil
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as nvcc
    except ImportError:
        return None
    for base in nvcc.__path__:
        cand = Path(base) / "bin" / "ptxas"
        if cand.is_file():
            return str(cand)
    return None


def sass_stats(ptx, cc, ptxas):
    """{"registers", "spill_bytes", "sass_instructions"} of the PTX's kernel(s),
    assembled by ``ptxas`` for ``sm_<cc>``."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx)
        run = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-O3", "-v", str(src),
                              "-o", str(out)], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"ptxas failed: {run.stderr.strip()[:300]}")
        regs = [int(x) for x in re.findall(r"Used (\d+) registers", run.stderr)]
        spill = [int(x) for x in re.findall(r"(\d+) bytes spill stores", run.stderr)]
        text = _code_bytes(out.read_bytes())
    return {"registers": max(regs) if regs else None, "spill_bytes": sum(spill),
            "sass_instructions": text // 16}


def _code_bytes(elf):
    """Total size of the ``.text.*`` sections of a 64-bit little-endian ELF (cubin)."""
    import struct
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", elf, shoff + k * shentsize)
                for k in range(shnum)]
    names_off = sections[shstrndx][4]
    total = 0
    for name, _type, _flags, _addr, _off, size in sections:
        end = elf.index(b"\0", names_off + name)
        if elf[names_off + name:end].startswith(b".text."):
            total += size
    return total


def analyze_ptx(ptxs, sass=None):
    """Summary of one adjoint made of one or more kernels' PTX texts; ``sass``: (cc,
    ptxas path) to add each kernel's :func:`sass_stats`."""
    atoms = [a for ptx in ptxs for a in atomic_lines(ptx)]
    classes = collections.Counter(classify_atomic(a) for a in atoms)
    extra = {} if sass is None else {"sass": [sass_stats(p, *sass) for p in ptxs]}
    return {**extra,
        "entries": sum(ptx.count(".entry") for ptx in ptxs),
        "kernels": len(ptxs),
        "instructions": sum(count_instructions(ptx) for ptx in ptxs),
        "atomics": len(atoms),
        "atomics_global": sum(n for (space, _), n in classes.items() if space == "global"),
        "atomics_shared": sum(n for (space, _), n in classes.items() if space == "shared"),
        "atomic_classes": {f"{space} {kind}": n
                           for (space, kind), n in sorted(classes.items())},
    }


# --------------------------------------------------------------------------------------
# collecting cases
# --------------------------------------------------------------------------------------


def perf_entries(names=None):
    """(name, source, kernel, args, hand-written (pyfunc, signature) list) per perf case."""
    from perf.cases_cuda import CASES, adjoint_signature

    out = []
    for case in CASES:
        if names and case.name not in names:
            continue
        args = case.make_args(case.size("check"), np.random.default_rng(0))
        sig = adjoint_signature(case, args)
        hand = [(f, sig) for f in case.hand.py_funcs]
        forward = (case.forward.py_func, tuple(sig[:len(args)]))
        out.append({"name": case.name, "source": "perf", "kernel": case.kernel,
                    "args": args, "hand": hand, "forward": forward})
    return out, []


def gallery_entries(names=None):
    """Entries for ``kernels/cuda/*.py`` (kadj's adjoint only); a missing package gives
    none, a module that fails to import is reported as a note."""
    notes = []
    try:
        pkg = importlib.import_module("kernels.cuda")
    except ImportError as exc:
        return [], [f"no CUDA gallery (kernels.cuda: {exc})"]
    modules = [pkg]
    for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except Exception as exc:
            notes.append(f"{info.name} not importable: {type(exc).__name__}: {exc}")
    out = []
    seen = set()
    for mod in modules:
        for case in getattr(mod, "CASES", ()) or ():
            name = getattr(case, "name", None) or repr(case)
            if (names and name not in names) or name in seen:
                continue
            seen.add(name)
            entry = {"name": name, "source": mod.__name__, "kernel": case.kernel,
                     "args": None, "hand": []}
            try:
                entry["args"] = tuple(case.make_args(np.random.default_rng(0)))
            except Exception as exc:
                entry["error"] = f"make_args failed: {type(exc).__name__}: {exc}"
            out.append(entry)
    return out, notes


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------


def _refusal_types():
    try:
        from kadj import DifferentiationError
        return (DifferentiationError,)
    except Exception:
        return ()


def report_entry(entry, cc, sass=None):
    """Compile and analyze one entry; returns a JSON-able record.  ``sass``: the path
    of ``ptxas``, to add registers and SASS instruction counts."""
    from numba import cuda
    sass = None if sass is None else (cc, sass)

    rec = {"name": entry["name"], "source": entry["source"]}
    if "error" in entry:
        rec["kadj_error"] = entry["error"]
        rec["failed"] = True
        return rec
    k, args = entry["kernel"], entry["args"]
    try:
        rec["kadj_report"] = _jsonable(k.adjoint_report(*args))
        rec["kadj"] = analyze_ptx([k.adjoint_ptx(*args, cc=cc)], sass)
        if (rec["kadj_report"].get("gather") or {}).get("arrays"):
            rec["kadj_gather"] = analyze_ptx([k.adjoint_ptx(*args, cc=cc, form=f)
                                              for f in ("gather", "zero")], sass)
    except _refusal_types() as exc:
        rec["kadj_refused"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except Exception as exc:
        rec["kadj_error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()
        rec["failed"] = True
    if entry["hand"]:
        try:
            ptxs = [cuda.compile_ptx(f, sig, cc=cc)[0] for f, sig in entry["hand"]]
            rec["hand"] = analyze_ptx(ptxs, sass)
            if sass is not None and entry.get("forward") is not None:
                f, sig = entry["forward"]
                rec["forward"] = analyze_ptx([cuda.compile_ptx(f, sig, cc=cc)[0]], sass)
        except Exception as exc:
            rec["hand_error"] = f"{type(exc).__name__}: {exc}"
            rec["traceback"] = traceback.format_exc()
            rec["failed"] = True
    return rec


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in (sorted(x, key=str) if isinstance(x, (set, frozenset))
                                      else x)]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def build_report(cc=(9, 0), names=None, gallery=True, sass=None):
    """Records for the perf cases and (``gallery=True``) the CUDA gallery, plus notes;
    ``sass``: the path of ``ptxas`` (:func:`report_entry`)."""
    entries, notes = perf_entries(names)
    if gallery:
        more, more_notes = gallery_entries(names)
        entries += more
        notes += more_notes
    return [report_entry(e, cc, sass) for e in entries], notes


def _atoms(r):
    return f"{r['atomics']} ({r['atomics_global']}g/{r['atomics_shared']}s)"


def _report_summary(rep):
    """kadj's per-array decisions: the ``arrays`` dict when present, else the other keys."""
    if not rep:
        return []
    lines = []
    arrays = rep.get("arrays")
    if isinstance(arrays, dict):
        for name, info in arrays.items():
            if isinstance(info, dict):
                bits = [f"{k}={info[k]}" for k in ("class", "accumulation") if k in info]
                bits += [f"{k}={v}" for k, v in info.items()
                         if k not in ("class", "accumulation", "why")]
                why = f"  ({info['why']})" if info.get("why") else ""
                lines.append(f"{name}: {', '.join(bits)}{why}")
            else:
                lines.append(f"{name}: {info}")
    other = {k: v for k, v in rep.items() if k != "arrays"}
    if other:
        lines.append(", ".join(f"{k}={v}" for k, v in other.items()))
    return lines


def _brief(message):
    """The first line of an error message and, for numba typing errors, the user's
    source line it points at."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    out = lines[:1]
    out += [ln for ln in lines if ln.startswith(("File ", ">>>"))][:2]
    return " | ".join(out)


def print_report(records, notes, cc):
    print(f"\nAtomics in the PTX of CUDA adjoints (cc {cc[0]}.{cc[1]}); "
          "atomics: total (global/shared), instr: PTX instructions\n")
    wn = max([6] + [len(r["name"]) for r in records])
    ws = max([6] + [len(r["source"]) for r in records])
    header = (f"{'kernel':<{wn}} {'source':<{ws}} {'kadj atomics':>13} {'kadj gather':>13}"
              f" {'hand atomics':>13} {'kadj instr':>10} {'hand instr':>10}")
    print(header)
    print("-" * len(header))
    for r in records:
        if "kadj" in r:
            ka, ki = _atoms(r["kadj"]), str(r["kadj"]["instructions"])
        elif "kadj_refused" in r:
            ka, ki = "refused", "-"
        else:
            ka, ki = "ERROR", "-"
        if "hand" in r:
            ha, hi = _atoms(r["hand"]), str(r["hand"]["instructions"])
        elif "hand_error" in r:
            ha, hi = "ERROR", "-"
        else:
            ha, hi = "-", "-"
        ga = _atoms(r["kadj_gather"]) if "kadj_gather" in r else "-"
        print(f"{r['name']:<{wn}} {r['source']:<{ws}} {ka:>13} {ga:>13} {ha:>13} {ki:>10} "
              f"{hi:>10}")
    print("\nPer kernel: atomic instructions by space and type, and kadj's report\n")
    for r in records:
        print(f"{r['name']}:")
        for who in ("kadj", "kadj_gather", "hand"):
            if who in r:
                classes = ", ".join(f"{k} x{n}" for k, n in r[who]["atomic_classes"].items())
                print(f"  {who} PTX: {r[who]['kernels']} kernel(s), "
                      f"atomics: {classes or 'none'}")
        if "kadj_refused" in r:
            print(f"  kadj refused: {r['kadj_refused']}")
        for key in ("kadj_error", "hand_error"):
            if key in r:
                print(f"  {key.replace('_', ' ')}: {_brief(r[key])}")
        for line in _report_summary(r.get("kadj_report")):
            print(f"  report: {line}")
    for note in notes:
        print(f"note: {note}")
    print()
    if any("sass" in r.get(w, {}) for r in records for w in ("kadj", "hand")):
        print_sass(records, cc)


def print_sass(records, cc):
    """Registers per thread and SASS instructions of every kernel, by ptxas."""
    print(f"Registers per thread / SASS instructions (ptxas, sm_{cc[0]}{cc[1]}; "
          "spilled bytes when any)\n")
    for r in records:
        parts = []
        for who, names in (("forward", ("forward",)), ("hand", None),
                           ("kadj", ("scatter",)), ("kadj_gather", ("gather", "zero"))):
            stats = (r.get(who) or {}).get("sass")
            if not stats:
                continue
            for k, st in enumerate(stats):
                label = names[k] if names else f"hand {k}"
                if who.startswith("kadj"):
                    label = f"kadj {label}"
                spill = f", spill {st['spill_bytes']} B" if st["spill_bytes"] else ""
                parts.append(f"{label} {st['registers']}/{st['sass_instructions']}{spill}")
        if parts:
            print(f"  {r['name']}: " + "; ".join(parts))
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="write the records as JSON")
    parser.add_argument("--cc", type=int, nargs=2, default=(9, 0), metavar=("MAJOR", "MINOR"))
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--no-gallery", action="store_true",
                        help="perf cases only (skip kernels/cuda)")
    parser.add_argument("--traceback", action="store_true",
                        help="print the tracebacks of failed compilations")
    parser.add_argument("--sass", action="store_true",
                        help="also assemble with ptxas: registers and SASS instructions")
    opts = parser.parse_args(argv)
    cc = tuple(opts.cc)
    ptxas = find_ptxas() if opts.sass else None
    if opts.sass and ptxas is None:
        parser.error("--sass needs ptxas (on PATH, or pip install nvidia-cuda-nvcc-cu12)")
    records, notes = build_report(cc, opts.cases, gallery=not opts.no_gallery, sass=ptxas)
    print_report(records, notes, cc)
    for r in records if opts.traceback else ():
        if "traceback" in r:
            print(f"{r['name']}:\n{r['traceback']}", file=sys.stderr)
    if opts.json:
        clean = [{k: v for k, v in r.items() if k != "traceback"} for r in records]
        Path(opts.json).write_text(json.dumps({"cc": list(cc), "records": clean,
                                               "notes": notes}, indent=2))
        print(f"wrote {opts.json}")
    return 1 if any(r.get("failed") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
