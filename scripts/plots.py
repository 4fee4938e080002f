"""Plot the main queries of the chart's Grafana dashboard into PNG pictures
(docs/img/panels-*.png), from the query results the node scenario
`s9_prometheus_scrapes_the_pods_dashboard_and_alerts_answer` writes to
target/node-prometheus/panels.json. These are plots of the dashboard's
queries as Prometheus answered them, not screenshots of Grafana. Run through
scripts/plots.sh.

What the pictures promise: one legend entry per series (labels added where
the panel's legend format leaves two alike), event names in a numbered key
under the plots (never clipped), counts (`increase()`, gauges of shards) on
integer axes with `increase()`'s extrapolation rounded away, and a note of
the rate window, by which rates trail the shaded outage.
"""

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# At most this many series per panel: the ones with the largest values.
MAX_SERIES = 8


def legend(fmt, labels):
    out = fmt
    for k, v in labels.items():
        if k == "pod":
            # The pods of a StatefulSet: name them by their ordinal.
            v = "replica " + v.rsplit("-", 1)[-1]
        out = out.replace("{{" + k + "}}", v)
    return out.strip() or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def unique_names(lines):
    """Give series whose legends are alike their distinguishing labels."""
    seen = {}
    for line in lines:
        seen.setdefault(line["name"], []).append(line)
    for name, group in seen.items():
        if len(group) < 2:
            continue
        keys = sorted({k for line in group for k in line["labels"]})
        differing = [k for k in keys if len({line["labels"].get(k) for line in group}) > 1]
        for line in group:
            extra = ", ".join(f"{k}={line['labels'].get(k, '')}" for k in differing)
            line["name"] = f"{name} ({extra})" if extra else name


def with_gaps(values, step):
    """The points with a break (NaN) wherever samples are missing, so that a
    series absent for a while (no replica scraped) is not drawn across."""
    out = []
    for x, y in values:
        if out and x - out[-1][0] > 1.5 * step:
            out.append((out[-1][0] + step, float("nan")))
        out.append((x, y))
    return out


def is_count(title, targets):
    """Counts: an `increase()` of a counter, or a gauge of shards."""
    return title.startswith("Shards owned") or any("increase(" in t["expr"] for t in targets)


def rate_window(targets):
    """The window of the panel's `rate()` or `increase()`, if any."""
    for t in targets:
        m = re.search(r"(rate|increase)\([^\[]*\[(\w+)\]\)", t["expr"])
        if m:
            return m.group(1), m.group(2)
    return None


def draw(ax, title, targets, data, event_keys, only_nonzero):
    start, step = data["start"], data["step"]
    scale, unit = (1 / 2**20, "MiB") if title.startswith("Memory") else (1, None)
    counts = is_count(title, targets)
    lines = []
    for t in targets:
        for s in t["series"]:
            values = [(x - start, y * scale) for x, y in s["values"] if y == y]
            if counts:
                # increase() extrapolates to the window's edges (1.33 where
                # one hand-over happened): a count is whole.
                values = [(x, float(round(y))) for x, y in values]
            if not values:
                continue
            peak = max(y for _, y in values)
            if only_nonzero and peak <= 0:
                continue
            lines.append({"peak": peak, "name": legend(t["legend"], s["labels"]),
                          "labels": s["labels"], "values": values})
    lines.sort(key=lambda line: -line["peak"])
    shown = lines[:MAX_SERIES]
    unique_names(shown)
    stacked = counts and any("increase(" in t["expr"] for t in targets) and len(shown) > 1
    if stacked:
        # Counts of events (hand-overs, reloads) stacked, so that six shards
        # moved at once read as six, not as one line drawn six times.
        xs = sorted({x for line in shown for x, _ in line["values"]})
        ys = [[dict(line["values"]).get(x, 0.0) for x in xs] for line in shown]
        ax.stackplot(xs, ys, labels=[line["name"] for line in shown], step="mid", alpha=0.85)
    else:
        styles = ["-", "--", ":", "-."]
        for i, line in enumerate(shown):
            values = with_gaps(line["values"], step)
            ax.plot([x for x, _ in values], [y for _, y in values], label=line["name"],
                    linewidth=1.6, linestyle=styles[i % len(styles)])
    for number, (name, times) in event_keys:
        x = times[0] - start
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(str(number), (x, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(2, -2), textcoords="offset points", va="top", fontsize=8, color="dimgrey")
        if len(times) > 1:
            ax.axvspan(x, times[1] - start, color="red", alpha=0.08)
    hidden = len(lines) - len(shown)
    window = rate_window(targets)
    subtitle = []
    if hidden > 0:
        subtitle.append(f"top {MAX_SERIES} of {len(lines)} series")
    if window:
        what = "rates" if window[0] == "rate" else "counts"
        subtitle.append(f"{what} over {window[1]} windows: they trail an event by up to {window[1]}")
    if stacked:
        subtitle.append("stacked")
    ax.set_title(title + (f"  ({'; '.join(subtitle)})" if subtitle else ""), fontsize=10, loc="left")
    ax.set_ylim(bottom=0)
    if counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if unit:
        ax.set_ylabel(unit, fontsize=8)
    elif window and window[0] == "rate":
        ax.set_ylabel("per second", fontsize=8)
    ax.tick_params(labelsize=7)
    if shown:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def figure(data, titles, out, only_nonzero):
    events = sorted(data["events"].items(), key=lambda e: e[1][0])
    event_keys = list(enumerate(events, start=1))
    fig, axes = plt.subplots(
        len(titles), 1, figsize=(11, 2.7 * len(titles) + 0.6), squeeze=False, sharex=True
    )
    for ax, title in zip(axes[:, 0], titles):
        draw(ax, title, data["panels"][title], data, event_keys, only_nonzero)
    key = "   ".join(
        f"{n}: {name}" + (" (shaded)" if len(times) > 1 else "") for n, (name, times) in event_keys
    )
    axes[-1, 0].set_xlabel("seconds into the scenario", fontsize=8)
    fig.text(0.01, 0.005, "Events: " + key, fontsize=8, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print(f"wrote {out}")


def main():
    source = Path(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads(source.read_text())
    figure(data, ["Shards owned per replica", "Shard hand-overs"], out / "panels-handover.png", True)
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
        out / "panels-workload.png",
        True,
    )


if __name__ == "__main__":
    main()
