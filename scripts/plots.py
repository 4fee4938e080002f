"""Render the main panels of the chart's Grafana dashboard into PNG plots
(docs/img/), from the query results the node scenario
`s9_prometheus_scrapes_the_pods_dashboard_and_alerts_answer` writes to
target/node-prometheus/panels.json. Run through scripts/plots.sh.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# At most this many series per panel: the ones with the largest values.
MAX_SERIES = 8


def legend(fmt, labels):
    out = fmt
    for k, v in labels.items():
        if k == "pod":
            # The pods of a StatefulSet: name them by their ordinal.
            v = "replica " + v.rsplit("-", 1)[-1]
        out = out.replace("{{" + k + "}}", v)
    return out or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def with_gaps(values, step):
    """The points with a break (NaN) wherever samples are missing, so that a
    series absent for a while (no replica scraped) is not drawn across."""
    out = []
    for x, y in values:
        if out and x - out[-1][0] > 1.5 * step:
            out.append((out[-1][0] + step, float("nan")))
        out.append((x, y))
    return out


def draw(ax, title, targets, start, step, events, only_nonzero):
    scale, unit = (1 / 2**20, "MiB") if title.startswith("Memory") else (1, None)
    lines = []
    for t in targets:
        for s in t["series"]:
            values = [(x - start, y * scale) for x, y in s["values"] if y == y]
            if not values:
                continue
            peak = max(y for _, y in values)
            if only_nonzero and peak <= 0:
                continue
            lines.append((peak, legend(t["legend"], s["labels"]), values))
    lines.sort(key=lambda line: -line[0])
    for _, name, values in lines[:MAX_SERIES]:
        values = with_gaps(values, step)
        ax.plot([x for x, _ in values], [y for _, y in values], label=name, linewidth=1.4)
    hidden = len(lines) - MAX_SERIES
    for name, times in events.items():
        ax.axvline(times[0] - start, color="grey", linestyle="--", linewidth=0.8)
        ax.text(times[0] - start, 1.0, " " + name, transform=ax.get_xaxis_transform(),
                rotation=90, va="top", ha="left", fontsize=7, color="grey")
        if len(times) > 1:
            ax.axvspan(times[0] - start, times[1] - start, color="red", alpha=0.08)
    ax.set_title(title + (f" (top {MAX_SERIES} of {len(lines)} series)" if hidden > 0 else ""), fontsize=10)
    ax.set_xlabel("seconds into the scenario", fontsize=8)
    ax.set_ylim(bottom=0)
    if unit:
        ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    if lines:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def figure(data, titles, out, only_nonzero):
    fig, axes = plt.subplots(len(titles), 1, figsize=(10, 2.6 * len(titles)), squeeze=False)
    for ax, title in zip(axes[:, 0], titles):
        draw(ax, title, data["panels"][title], data["start"], data["step"], data["events"], only_nonzero)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print(f"wrote {out}")


def main():
    source = Path(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads(source.read_text())
    figure(data, ["Shards owned per replica", "Shard hand-overs"], out / "dashboard-handover.png", True)
    figure(
        data,
        [
            "Reconciles per shard",
            "Reconcile errors per shard",
            "KMS requests by status",
            "Workload reloads by kind",
            "KMS budget and demand per replica",
            "Memory per replica",
        ],
        out / "dashboard-workload.png",
        True,
    )


if __name__ == "__main__":
    main()
