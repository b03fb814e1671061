"""``--plot``: images/s against worker count, drawn with matplotlib."""

from __future__ import annotations

__all__ = ["plot_scaling"]


def plot_scaling(points: dict[str, dict[int, float]], limit_per_worker: float, path: str,
                 title: str) -> None:
    """Images/s against worker count, one line per framework, plus the pipeline limit."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    all_workers = sorted({w for series in points.values() for w in series})
    limit = [limit_per_worker * max(w, 1) for w in all_workers]
    axes.plot(all_workers, limit, linestyle="--", color="grey",
              label="limit: single-core pipeline x workers")
    for name, series in points.items():
        workers = sorted(series)
        axes.plot(workers, [series[w] for w in workers], marker="o", label=name)
    axes.set_xlabel("num_workers")
    axes.set_ylabel("images / s")
    axes.set_xticks(all_workers)
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
