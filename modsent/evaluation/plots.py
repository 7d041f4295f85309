"""Training curves shared by every training stage: loss.tsv and loss.png beside the outputs."""

from __future__ import annotations

from pathlib import Path


def write_loss_curve(history: list, out_dir: Path, *, title: str, ylabel: str = "loss",
                     lines: dict[str, float | None] | None = None) -> None:
    """``loss.tsv`` (step, loss, lr) and ``loss.png`` of ``history`` ([step, loss, lr] rows);
    ``lines`` adds labelled horizontal reference lines (e.g. held-out losses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(Path(out_dir) / "loss.tsv", "w", encoding="utf-8") as handle:
        handle.write("step\tloss\tlr\n")
        for step, loss, lr in history:
            handle.write(f"{step}\t{loss:.6f}\t{lr:.3e}\n")
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if history:
        ax.plot([h[0] for h in history], [h[1] for h in history], label=f"training {ylabel}")
    for (label, value), style in zip((lines or {}).items(), ("--", ":", "-.")):
        if value is not None:
            ax.axhline(value, linestyle=style, color="grey", label=f"{label}: {value:.2f}")
    if history or lines:
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "loss.png")
    plt.close(fig)


def write_before_after_bars(labels: list[str], before: list, after: list, path: str | Path, *,
                            stage: str, ylabel: str, ylim: tuple[float, float] | None = None,
                            better: str = "higher", digits: int = 1) -> None:
    """A bar pair per label (before and after ``stage``), each bar labelled with its value
    (``digits`` decimals), the axis saying which way is better; written to ``path`` atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from modsent.io import atomic_path

    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels)), 4.2), dpi=100)
    xs = range(len(labels))
    for offset, values, label in ((-0.2, before, f"before {stage}"), (0.2, after, f"after {stage}")):
        bars = ax.bar([x + offset for x in xs], [v or 0 for v in values], 0.4, label=label)
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:.{digits}f}" for v in values], fontsize=7, padding=1)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel(f"{ylabel}\n({better} is better)")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)  # below: no bar hidden
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
