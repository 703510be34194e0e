"""Replay plots (needs matplotlib: pip install 'ascmem[plot]')."""

from ascmem.errors import AscmemError

COLORS = {"huge": "#1f77b4", "normal": "#2ca02c", "dvpp": "#ff7f0e", "host": "#9467bd",
          "": "#1f77b4"}


def require():
    """Raises, with the install hint, if matplotlib is missing (checked before
    a replay, not after it)."""
    try:
        import matplotlib.figure  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        raise AscmemError("--plot needs matplotlib: pip install matplotlib") from None


def replay_plot(trace, report, path, title=None):
    """Writes a PNG: live requested bytes per kind over event time (stacked),
    the footprint (a device's pages in use, or an allocator's bytes held after
    rounding), the peak and the first failure marked.  Draws on a Figure of
    its own (the Agg canvas), so matplotlib's global backend is left alone."""
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    live = report["curve_live"]
    used = report["curve_used"]
    if not live:
        raise AscmemError("the replay recorded no events to plot")
    # steadiest kinds at the bottom, so the moving ones stay readable on top
    kinds = sorted({k for point in live for k in point},
                   key=lambda k: -min(point.get(k, 0) for point in live[len(live) // 10:] or live))
    x = range(len(live))
    mib = float(1 << 20)
    fig = Figure(figsize=(11, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    stacks = [[point.get(k, 0) / mib for point in live] for k in kinds]
    ax.stackplot(x, *stacks, labels=[f"live, {k or 'all'}" for k in kinds],
                 colors=[COLORS.get(k, None) for k in kinds], alpha=0.75)
    ax.plot(x, [u / mib for u in used], color="#333333", linewidth=0.6, alpha=0.8,
            label=report.get("curve_used_label", "held after rounding"))
    totals = [sum(p.values()) for p in live]
    peak_i = max(range(len(totals)), key=totals.__getitem__)
    ax.plot([peak_i], [totals[peak_i] / mib], marker="v", color="crimson", markersize=7,
            linestyle="none", label=f"peak live {totals[peak_i] / mib:,.1f} MiB (event {peak_i:,})")
    if report.get("first_failure"):
        f = report["first_failure"]
        ax.axvline(f["event"], color="red", linewidth=1.2,
                   label=f"first failure ({f['size']:,} B)")
    ax.set_xlabel("event")
    ax.set_ylabel("MiB")
    ax.set_title(title or trace.name)
    ax.set_xlim(0, max(len(live) - 1, 1))
    ax.set_ylim(0, max(totals) / mib * 1.12)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plan_plot(plan, path):
    """Writes a PNG: the device memory the workload holds over event time
    under each allocator (one instance), from a plan made with curves."""
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    mib = float(1 << 20)
    drawn = 0
    for fp in plan.footprints:
        if fp.curve:
            ax.plot(range(len(fp.curve)), [v / mib for v in fp.curve], linewidth=0.9,
                    label=f"{fp.allocator} (peak {fp.peak / mib:,.1f} MiB)")
            drawn += 1
    if not drawn:
        raise AscmemError("the plan recorded no curves to plot")
    ax.set_xlabel("event")
    ax.set_ylabel("device MiB held")
    ax.set_title(f"{plan.trace}: device memory per allocator")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    return path
