"""The GPU benchmark scripts, run through in the CUDA simulator so that they do not rot
between the runs on a GPU: ``scripts/bench_cuda.py`` (every measurement of a case:
forward, hand-written, naive-atomics and kadj adjoints, the scatter form, the traffic
and bandwidth table) and ``scripts/bench_cuda_gallery.py`` (timing and the gradient
check at a size).  The simulator's event timings mean nothing; what is checked is that
every path runs and that the adjoints agree with the hand-written ones.  The scripts
refuse the simulator (``no GPU``), so ``gpu_status`` is replaced in the subprocess
(NUMBA_ENABLE_CUDASIM=1 must be set before numba is imported)."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{root!r}, {scripts!r}]
    import bench_cuda, bench_cuda_gallery
    from perf.cases_cuda import CASES_BY_NAME
    out = {{}}
    r = bench_cuda.bench_case(CASES_BY_NAME["heat2d"], "check", 1)
    ceiling = bench_cuda.copy_bandwidth(nbytes=8 * 512, repeat=1)
    bench_cuda.print_table([r], "check", 1, "simulator", abs(ceiling) or 1.0)
    out["bench"] = {{k: v for k, v in r.items() if not isinstance(v, float)}}
    bench_cuda_gallery.gpu_status = lambda: (True, "simulator")
    rc = bench_cuda_gallery.main(["--n", "40", "--check-n", "40", "--repeat", "1",
                                  "--only", "heat1d_guarded", "dense_tanh",
                                  "--json", {json_path!r}])
    out["gallery_rc"] = rc
    print("RESULT " + json.dumps(out, default=str))
""")


def test_gpu_benchmark_scripts_run_in_the_simulator(tmp_path):
    json_path = str(tmp_path / "gallery.json")
    code = SCRIPT.format(root=ROOT, scripts=os.path.join(ROOT, "scripts"),
                         json_path=json_path)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    bench = out["bench"]
    assert "error" not in bench, bench
    assert bench["allclose"] and bench["scatter_allclose"] and bench["naive_allclose"]
    assert bench["kadj_form"] == "gather"
    assert bench["bytes_adj"] > bench["bytes_fwd"] > 0
    assert "memory bandwidth" in proc.stdout and "naive/block" in proc.stdout
    assert out["gallery_rc"] == 0, proc.stdout[-3000:]
    records = json.loads(open(json_path).read())["records"]
    assert [r["case"] for r in records] == ["heat1d_guarded", "dense_tanh"]
    for r in records:
        assert r["ratio"] > 0 and r["check_rel_error"] < 1e-6, r
