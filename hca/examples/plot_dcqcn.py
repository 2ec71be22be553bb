#!/usr/bin/env python3
"""Plots the CSVs of `cargo run --release -p hca --example dcqcn_incast -- --csv DIR`.

usage: plot_dcqcn.py DIR OUT_DIR
For each experiment (incast-N, victim-N) one PNG: a row per control (pfc, lossy, dcqcn+pfc),
per-flow throughput (Gb/s) on the left, the congested port's queue (KB) on the right.
Needs matplotlib (a venv: python3 -m venv V && V/bin/pip install matplotlib).
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONTROLS = ["pfc", "lossy", "dcqcn_pfc"]


def load(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    cols = list(zip(*[[float(x) for x in r] for r in body]))
    return head, cols


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    names = sorted({f.rsplit("-", 1)[0] for f in os.listdir(src) if f.endswith(".csv")})
    for name in names:
        fig, axes = plt.subplots(len(CONTROLS), 2, figsize=(11, 8), sharex=True)
        for row, control in enumerate(CONTROLS):
            path = os.path.join(src, f"{name}-{control}.csv")
            if not os.path.exists(path):
                continue
            head, cols = load(path)
            t = [x / 1000.0 for x in cols[0]]
            ax = axes[row][0]
            flows = [i for i, h in enumerate(head) if h.startswith("flow")]
            for i in flows:
                label = head[i].replace("_gbps", "")
                if name.startswith("victim") and i == flows[-1]:
                    label = "victim"
                ax.plot(t, cols[i], linewidth=0.8, label=label if len(flows) <= 9 else None)
            ax.set_ylabel(f"{control.replace('_', '+')}\nGb/s")
            ax.set_ylim(0, 41)
            if len(flows) <= 9:
                ax.legend(fontsize=6, ncol=3, loc="upper right")
            qa = axes[row][1]
            qa.plot(t, [q / 1000.0 for q in cols[-1]], color="black", linewidth=0.8)
            qa.axhline(5, color="green", linestyle=":", linewidth=0.8)
            qa.axhline(200, color="red", linestyle=":", linewidth=0.8)
            qa.set_ylabel("queue KB")
            qa.set_yscale("symlog", linthresh=10)
            qa.set_ylim(bottom=0)
        axes[-1][0].set_xlabel("time (ms)")
        axes[-1][1].set_xlabel("time (ms)")
        fig.suptitle(f"{name}: 40 Gb/s, RED 5 KB / 200 KB / 1 % (dotted), per 100 us")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{name}.png"), dpi=80)
        plt.close(fig)
        print(os.path.join(out, f"{name}.png"))


if __name__ == "__main__":
    main()
