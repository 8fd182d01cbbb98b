"""The ``demo`` subcommand's options (argparse only: ``kadj --help`` compiles nothing
and imports neither SciPy nor matplotlib)."""

HELP = "recover a diffusivity field from a noisy observation (inverse problem)"

DESCRIPTION = """\
Solve an inverse problem end to end: recover the unknown diffusivity kappa(x, y) of a
2-D heat equation u_t = div(kappa grad u) from a noisy observation of the temperature
after STEPS explicit time steps, by L-BFGS-B (SciPy) on kadj gradients.  Each gradient
is recorded on a kadj.Tape, the time loop inside kadj.checkpointed_loop (bounded
memory).  Shows a progress bar, prints a summary (iterations, final loss, relative
error of the recovered field, gradient time / forward time, a finite-difference check
of one gradient) and writes a PNG: true field, recovered field, observation, loss
curve.  Exit status 1 when the finite-difference check fails.  Needs the demo extra:
pip install "kadj[demo]" (scipy, matplotlib, tqdm)."""

QUICK = {"size": 48, "steps": 60, "iters": 30}
DEFAULTS = {"size": 128, "steps": 200, "iters": 60}


def add_arguments(p):
    p.description = DESCRIPTION
    p.add_argument("--size", type=int, default=None, metavar="N",
                   help=f"cells per side of the grid (default {DEFAULTS['size']}; "
                        f"--quick: {QUICK['size']})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"explicit time steps (default {DEFAULTS['steps']}; "
                        f"--quick: {QUICK['steps']})")
    p.add_argument("--iters", type=int, default=None,
                   help=f"maximum L-BFGS iterations (default {DEFAULTS['iters']}; "
                        f"--quick: {QUICK['iters']})")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the kernels run: auto (default) is cuda when "
                        "numba.cuda.is_available(), else cpu")
    p.add_argument("--output", "-o", default="kadj-demo.png", metavar="PATH",
                   help="the PNG to write (default: kadj-demo.png in the current "
                        "directory)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smaller problem: {QUICK['size']}x{QUICK['size']} cells, "
                        f"{QUICK['steps']} steps, {QUICK['iters']} iterations")
    p.add_argument("--snapshots", type=int, default=None,
                   help="state copies checkpointed_loop may hold (default: about "
                        "sqrt(steps))")
    p.add_argument("--noise", type=float, default=0.01,
                   help="observation noise, relative to the largest temperature "
                        "(default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="random seed (noise, FD direction)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--mpi", action="store_true",
                   help="decompose the problem over the ranks of mpiexec -n P python "
                        "-m kadj demo --mpi (kadj.mpi; CPU kernels; rank 0 prints and "
                        "writes the PNG)")


def resolve(opts):
    """Fill the size options left unset from --quick or the defaults."""
    base = QUICK if opts.quick else DEFAULTS
    for name, value in base.items():
        if getattr(opts, name) is None:
            setattr(opts, name, value)
    return opts


def run(opts):
    if opts.mpi:
        from .mpi import run as run_mpi
        return run_mpi(resolve(opts))
    from .solve import main
    return main(resolve(opts))
