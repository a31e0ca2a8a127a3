"""Draws `warmbox costs --chart FILE`: the cost per day stacked by tenant, and
the running and paused sandboxes over time (PNG or SVG by FILE's name).

    costs_chart.py DATA.json FILE

DATA: {"cost": [{"day": "YYYY-MM-DD", "tenant": t, "usd": x}],
       "timeline": [{"t": unix seconds, "running": n, "paused": n}]}
"""
import json
import sys
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402


def main(data_path, out):
    with open(data_path) as f:
        data = json.load(f)
    cost = data.get("cost") or []
    timeline = data.get("timeline") or []
    days = sorted({c["day"] for c in cost})
    tenants = sorted({c["tenant"] for c in cost})
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7.5))

    bottom = [0.0] * len(days)
    for tenant in tenants:
        vals = [sum(c["usd"] for c in cost if c["day"] == d and c["tenant"] == tenant) for d in days]
        ax1.bar(days, vals, bottom=bottom, label=tenant)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax1.annotate("$%.4f" % total, (i, total), ha="center", va="bottom", fontsize=8)
    ax1.set_title("Sandbox compute cost per day (UTC), by tenant")
    ax1.set_ylabel("US$ (E2B's rates)")
    ax1.set_xlabel("day (UTC)")
    if tenants:
        ax1.legend(title="tenant", fontsize=8)
    if not days:
        ax1.text(0.5, 0.5, "no cost in this window", ha="center", transform=ax1.transAxes)

    if timeline:
        ts = [datetime.fromtimestamp(p["t"], tz=timezone.utc) for p in timeline]
        running, paused = [p["running"] for p in timeline], [p["paused"] for p in timeline]
        ax2.step(ts, paused, where="post", color="tab:orange", label="paused (free at E2B)")
        ax2.step(ts, running, where="post", color="tab:blue", linewidth=1.8, zorder=3, label="running (billed)")
        span = timeline[-1]["t"] - timeline[0]["t"]
        ax2.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if span < 3 * 3600 else "%m-%d %H:%M"))
        plt.setp(ax2.get_xticklabels(), rotation=30, ha="right")
        ax2.legend(fontsize=8)
    ax2.set_title("Sandboxes over time")
    ax2.set_ylabel("sandboxes")
    ax2.set_xlabel("time (UTC)")
    ax2.yaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
