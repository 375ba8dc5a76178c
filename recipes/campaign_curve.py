"""The campaign's curve: teacher-forced tau on the held-out and the calibration split against training
answer tokens, from `log.jsonl` files of `recipes/yue_smol_campaign.py` runs in order (a development script).

    python recipes/campaign_curve.py OUT.png LOG [LOG ...]

A later file's tokens continue from the earlier files' last count unless its own count already does
(a run that resumed the same folder); its round 0 (the starting weights, measured again) is skipped.
Prints the points as a table too.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def points(paths: list[str]) -> list[tuple[float, dict]]:
    out, offset = [], 0.0
    for i, path in enumerate(paths):
        records = [json.loads(line) for line in open(path) if line.strip()]
        if i and records and out and records[-1]["tokens_seen"] <= out[-1][0]:
            offset = out[-1][0]  # a fresh folder: its count starts again at 0
        for r in records:
            if i and r["round"] == 0:
                continue
            t = offset + r["tokens_seen"] if offset else r["tokens_seen"]
            if out and t <= out[-1][0]:
                continue  # the same round again (a resumed folder's log repeats its earlier rounds)
            out.append((t, r["tau"]))
    return out


def main(png: str, *logs: str) -> None:
    pts = points(list(logs))
    names = sorted(pts[0][1])
    print("answer tokens (M) | " + " | ".join(names))
    for t, tau in pts:
        print(f"{t / 1e6:.2f} | " + " | ".join(f"{tau[n]:.3f}" for n in names))
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for n in names:
        ax.plot([t / 1e6 for t, _ in pts], [tau[n] for _, tau in pts], marker="o", ms=3, label=n)
    ax.set_xlabel("training answer tokens (millions)")
    ax.set_ylabel("teacher-forced tau (7 drafts)")
    ax.set_title("yue-smol NAR set, issue-42 campaign")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
