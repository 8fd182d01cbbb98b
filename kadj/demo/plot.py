"""The demo's picture: true field, recovered field, observation, loss curve (PNG,
matplotlib's Agg backend, so no display is needed)."""


def save_figure(path, problem, kappa, losses, errors, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo = min(float(problem.kappa_true.min()), float(kappa.min()))
    hi = max(float(problem.kappa_true.max()), float(kappa.max()))
    fig, axes = plt.subplots(2, 2, figsize=(8.4, 7.2), dpi=80)
    panels = ((axes[0, 0], problem.kappa_true, "true diffusivity $\\kappa$", (lo, hi)),
              (axes[0, 1], kappa, "recovered $\\kappa$", (lo, hi)),
              (axes[1, 0], problem.obs, "observation: noisy final temperature", None))
    for ax, field, name, limits in panels:
        vmin, vmax = limits if limits else (None, None)
        cmap = "viridis" if limits else "RdBu_r"
        if not limits:
            vmax = float(abs(field).max())
            vmin = -vmax
        im = ax.imshow(field.T, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                       extent=(0, 1, 0, 1))
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax = axes[1, 1]
    its = range(len(losses))
    ax.semilogy(its, losses, color="C0", label="loss")
    ax.set_xlabel("L-BFGS iteration")
    ax.set_ylabel("loss", color="C0")
    ax.set_title("convergence", fontsize=10)
    ax2 = ax.twinx()
    ax2.plot(its, errors, color="C3", label="field error")
    ax2.set_ylabel("relative error of $\\kappa$", color="C3")
    ax2.set_ylim(0.0, max(1.05, max(errors) * 1.05))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
