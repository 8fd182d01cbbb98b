"""Write docs/gallery.md: every gallery kernel, what it computes and what its adjoint costs.

CPU kernels (``kernels.cpu.GALLERY``): the first sentence of the kernel's docstring, the
measured adjoint/forward time ratio (median of ``--repeat`` runs of each, taken in
turn, in CPU seconds of this process, one numba thread, arrays copied before each run
outside the timing) at size ``--size`` through the example's ``sized`` maker (a tenth
of it, repeatedly, while one forward run takes over 50 ms: quadratic kernels) and the
adjoint's accumulation classes: per adjoint buffer, whether contributions are added
(``+=``), the element's cotangent consumed (read and reset where the kernel overwrote
it) or both, and how its loops are reversed, read from the adjoint IR.

CUDA kernels (``kernels.cuda.all_cases()``): the first docstring sentence, the adjoint's form
(scatter; gather where the report offers it), the accumulation class of each array
(``adjoint_report()["arrays"]``) and the atomic instructions in the adjoint's PTX
(``adjoint_ptx``, no GPU needed); timing needs a GPU (``scripts/bench_cuda.py``).

    python scripts/gallery_doc.py [--out docs/gallery.md] [--size 1000000] [--repeat 7]
    python scripts/gallery_doc.py --only thomas_batched    # one row measured again
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

_ACC = re.compile(r"^\s*(Accumulate|Consume)\(target=AdjElem\((\w+)\[")
_LOOP = re.compile(r"ReverseLoop\(strategy='(\w+)'")


def first_line(fn):
    """The first sentence of ``fn``'s docstring (of its Python function for a
    dispatcher), its lines joined."""
    py = getattr(fn, "py_func", fn)
    doc = (getattr(py, "__doc__", None) or "").strip()
    paragraph = " ".join(line.strip() for line in doc.split("\n\n")[0].splitlines())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[:end + 1]


def _cell(text):
    return text.replace("|", "\\|")


# ---- CPU -------------------------------------------------------------------------------
def accumulation_classes(ir_text):
    """``{adjoint buffer: "+=" | "consumed" | "consumed, +="}`` and the reversed loops'
    strategies, from the adjoint IR's text."""
    seen = collections.defaultdict(set)
    for line in ir_text.splitlines():
        m = _ACC.match(line)
        if m:
            seen[m.group(2)].add("consumed" if m.group(1) == "Consume" else "+=")
    classes = {name: ", ".join(sorted(kinds)) for name, kinds in seen.items()}
    loops = collections.Counter(_LOOP.findall(ir_text))
    return classes, loops


def _copy(args):
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def _time(fn, args):
    """CPU seconds of this process for ``fn(*args)``: steadier than wall-clock time on
    a machine that other work shares (numba runs on this thread: one thread)."""
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


def _sized(ex, size, budget):
    """(size, args): the example's arguments at ``size``, divided by 10 until one
    forward run takes at most ``budget`` seconds (quadratic kernels), or the example's
    own arguments (size None) for a kernel without a size."""
    if ex.sized is None:
        return None, ex.make_args(np.random.default_rng(0))
    n = size
    while True:
        args = ex.sized(np.random.default_rng(0), n)
        if n <= 1000 or _time(ex.kernel, _copy(args)) <= budget:
            return n, args
        n //= 10


def _ratio(forward, adjoint, fwd_args, adj_args, repeat):
    """The median adjoint time over the median forward time, the two run in turn
    (so that load from other work weighs on both alike), arguments copied outside the
    timing."""
    fwd, adj = [], []
    for _ in range(repeat):
        fwd.append(_time(forward, fwd_args()))
        adj.append(_time(adjoint, adj_args()))
    return statistics.median(adj) / statistics.median(fwd)


def _out_of_bounds(ex, args, adjs):
    """Run the adjoint once at the timed size compiled with bounds checks (numba
    rereads ``NUMBA_BOUNDSCHECK`` before each compilation; kadj's cache keys on it):
    the ``IndexError`` message if it indexes outside an array, else None.  Timing such
    an adjoint without bounds checks would corrupt memory."""
    import kadj
    os.environ["NUMBA_BOUNDSCHECK"] = "1"
    try:
        k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
        k.adjoint(*_copy(args), *[a.copy() for a in adjs])
        return None
    except IndexError as exc:
        return str(exc)
    finally:
        os.environ["NUMBA_BOUNDSCHECK"] = "0"


def cpu_rows(size, repeat, budget=0.05, only=None):
    import numba

    import kadj
    from kernels.cpu import GALLERY

    numba.set_num_threads(1)
    rows = []
    for ex in GALLERY:
        if only is not None and ex.name not in only:
            continue
        k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
        small = ex.make_args(np.random.default_rng(0))
        ex.kernel(*_copy(small))                # compile the forward before sizing
        n, args = _sized(ex, size, budget)
        plan = k.adjoint_plan(*args)
        adjs = [np.zeros_like(args[i]) if isinstance(args[i], np.ndarray)
                else np.zeros(1, np.asarray(args[i]).dtype) for i in plan.adjoint_args]

        def fwd_args():
            return _copy(args)

        def adj_args():
            return _copy(args) + tuple(a.copy() for a in adjs)
        bad = _out_of_bounds(ex, args, adjs)
        if bad is not None:
            rows.append((ex.name, first_line(ex.kernel), str(n),
                         f"not timed: the adjoint indexes out of bounds ({bad})", "", ""))
            print(f"cpu {ex.name}: {n} OUT OF BOUNDS {bad}", file=sys.stderr)
            continue
        k.adjoint(*adj_args())                  # compile the adjoint before timing
        ratio = _ratio(ex.kernel, k.adjoint, fwd_args, adj_args, repeat)
        classes, loops = accumulation_classes(k.show_stage("adjoint-ir", *args))
        acc = "; ".join(f"`{n}` {c}" for n, c in sorted(classes.items())) or "—"
        loop_text = ", ".join(f"{s}" + (f" ×{c}" if c > 1 else "")
                              for s, c in sorted(loops.items())) or "—"
        rows.append((ex.name, first_line(ex.kernel), "example" if n is None else str(n),
                     f"{ratio:.1f}", acc, loop_text))
        print(f"cpu {ex.name}: {n} {ratio:.2f}", file=sys.stderr)
    return rows


# ---- CUDA ------------------------------------------------------------------------------
def cuda_rows(cc):
    from kernels.cuda import all_cases
    from ptx_report import atomic_lines

    rows = []
    for case in all_cases():
        k = case.kernel
        args = case.make_args(np.random.default_rng(0))
        report = k.adjoint_report(*args)
        gather = report.get("gather", {})
        form = "scatter" + (f"; gather {gather['used']}" if gather.get("used") else "")
        classes = "; ".join(f"`{n}` {a['class']}/{a['accumulation']}"
                            for n, a in sorted(report.get("arrays", {}).items()))
        try:
            atomics = str(len(atomic_lines(k.adjoint_ptx(*args, cc=cc))))
        except Exception as exc:  # no NVVM here: say so rather than guess
            atomics = f"n/a ({type(exc).__name__})"
        rows.append((case.name, first_line(k), form, classes or "—", atomics))
        print(f"cuda {case.name}: {atomics}", file=sys.stderr)
    return rows


# ---- page ------------------------------------------------------------------------------
def page(cpu, cuda, size, repeat, cc):
    out = [
        "# Gallery",
        "",
        "Every kernel of the gallery (`kernels/cpu`, `kernels/cuda`), what it computes and "
        "what its adjoint costs.  Each kernel's gradient is checked against finite "
        "differences by the test suite (`tests/test_gallery_cpu.py`, "
        "`tests/test_cuda_gallery.py`).  This page is written by "
        "`python scripts/gallery_doc.py`; run it again after adding a kernel.",
        "",
        "## CPU (`@njit`)",
        "",
        f"*adjoint/forward*: the adjoint's time over the forward's, each the median of "
        f"{repeat} runs taken in turn, at *size* (elements, rows, cells or pairs along "
        f"the kernel's main loop: {size}, or a tenth of it until a forward run takes at "
        "most 50 ms; `example`: the example's arguments, for a kernel without a size), "
        f"one numba thread, CPU time of the process, on {platform.machine()} ({os.cpu_count()} cores), measured when the "
        "page was written; the adjoint's time includes its forward sweep and any copies "
        "it makes.  *accumulation*: per adjoint buffer, `+=` (contributions added), "
        "`consumed` (the cotangent of an element the kernel overwrote, read and reset) "
        "or both.  *reversed loops*: how each loop with reverse code is reversed "
        "(`ascending`: independent iterations, run in forward order; `recomputed`: in "
        "reverse order, values recomputed; `taped`: in reverse order, values recorded on "
        "the tape; `replayed`/`checkpointed`: one iteration at a time, from saved or "
        "checkpointed state).",
        "",
        "| kernel | computes | size | adjoint/forward | accumulation | reversed loops |",
        "|---|---|---|---|---|---|",
    ]
    out += [f"| `{n}` | {_cell(d)} | {z} | {r} | {_cell(a)} | {lp} |"
            for n, d, z, r, a, lp in cpu]
    out += [
        "",
        "## CUDA (`@cuda.jit`)",
        "",
        "*form*: the adjoint kernel's form (`scatter`, and the condition under which a "
        "`gather` form without atomics is offered: `adjoint_source(..., form=\"gather\")`). "
        "*arrays*: each array's accumulation class and how its adjoint is accumulated "
        f"(`adjoint_report()[\"arrays\"]`).  *PTX atomics*: atomic instructions in the "
        f"scatter adjoint's PTX (`adjoint_ptx(..., cc={cc})`).  *adjoint/forward*: GPU "
        "only (`scripts/bench_cuda.py` on a machine with a GPU).",
        "",
        "| kernel | computes | form | arrays | PTX atomics | adjoint/forward |",
        "|---|---|---|---|---|---|",
    ]
    out += [f"| `{n}` | {_cell(d)} | {_cell(f)} | {_cell(c)} | {a} | GPU only |"
            for n, d, f, c, a in cuda]
    return "\n".join(out) + "\n"


def replace_cpu_rows(text, rows):
    """``text`` (the page) with the CPU table's rows of ``rows``' kernels replaced, and
    those it lacks added, the table in gallery order."""
    from kernels.cpu import GALLERY
    head, rest = text.split("## CPU", 1)
    table, tail = rest.split("\n## ", 1)
    lines = table.split("\n")
    old = {}
    for line in lines:
        m = re.match(r"\| `(\w+)` \|", line)
        if m:
            old[m.group(1)] = line
    for n, d, z, r, acc, lp in rows:
        old[n] = f"| `{n}` | {_cell(d)} | {z} | {r} | {_cell(acc)} | {lp} |"
    first = next(k for k, line in enumerate(lines) if re.match(r"\| `", line))
    last = max(k for k, line in enumerate(lines) if re.match(r"\| `", line))
    ordered = [old[ex.name] for ex in GALLERY if ex.name in old]
    lines = lines[:first] + ordered + lines[last + 1:]
    return head + "## CPU" + "\n".join(lines) + "\n## " + tail


def replace_cuda_timings(text, path):
    """``text`` (the page) with the CUDA table's *adjoint/forward* cells taken from
    ``path``, a JSON file of ``scripts/bench_cuda_gallery.py`` records (kernels it
    lacks keep "GPU only"), and the table's note saying where they come from."""
    data = json.loads(pathlib.Path(path).read_text())
    ratios = {r["case"]: r["ratio"] for r in data["records"] if "ratio" in r}
    head, rest = text.split("## CUDA", 1)
    lines = rest.split("\n")
    for k, line in enumerate(lines):
        m = re.match(r"\| `(\w+)` \|", line)
        if m:
            cells = line.split(" | ")
            ratio = ratios.get(m.group(1))
            cells[-1] = (f"{ratio:.2f}x |" if ratio is not None else "GPU only |")
            lines[k] = " | ".join(cells)
        elif line.startswith("*form*"):
            lines[k] = re.sub(r"\*adjoint/forward\*:.*$", (
                f"*adjoint/forward*: measured on {data['device']} at about {data['n']} "
                f"elements (`scripts/bench_cuda_gallery.py`, minimum of {data['repeat']} "
                f"launches with CUDA events; records: `{pathlib.Path(path).name}` in "
                "`perf/results`; measured with the adjoints of their time: the other "
                "columns describe the current ones, see the README's \"Measured on a "
                "GPU\" for what changed since); `GPU only`: not measured yet."), line)
    return head + "## CUDA" + "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "gallery.md"))
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--cc", type=int, nargs=2, default=(8, 0))
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="measure only these CPU kernels again: their rows are replaced "
                        "(or added, in gallery order) in the existing page, the other "
                        "rows kept")
    p.add_argument("--cuda-only", action="store_true",
                   help="write the CUDA table again (no timing: its PTX is compiled) and "
                        "keep the CPU table of the existing page")
    p.add_argument("--gpu-timings", metavar="JSON",
                   help="fill the CUDA table's adjoint/forward column from "
                        "bench_cuda_gallery.py records")
    a = p.parse_args(argv)
    os.environ["NUMBA_BOUNDSCHECK"] = "0"       # timed code as users run it
    cc = tuple(a.cc)
    if a.cuda_only:
        old = pathlib.Path(a.out).read_text()
        new = page([], cuda_rows(cc), a.size, a.repeat, cc)
        text = old.split("## CUDA", 1)[0] + "## CUDA" + new.split("## CUDA", 1)[1]
    elif a.only:
        text = replace_cpu_rows(pathlib.Path(a.out).read_text(),
                                cpu_rows(a.size, a.repeat, only=set(a.only)))
    else:
        text = page(cpu_rows(a.size, a.repeat), cuda_rows(cc), a.size, a.repeat, cc)
    if a.gpu_timings:
        text = replace_cuda_timings(text, a.gpu_timings)
    pathlib.Path(a.out).write_text(text)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
