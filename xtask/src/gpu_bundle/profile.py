"""Sums a cubecl profiling log (`[profiling.logger] level = "basic"`: one `| duration | kernel`
line per launch, each launch waited for) by kernel: launches, total time, share, mean. Written
into the GPU bundle by `cargo xtask gpu-bundle`; `bash run.sh --profile` runs it.

    python3 profile.py LOG TITLE

The durations include each launch's wait, so they are not the run's timings; the counts are.
"""

import collections
import re
import sys

UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
LINE = re.compile(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)")


def main(log, title, top=30):
    totals = collections.defaultdict(lambda: [0, 0.0])
    launches, seconds = 0, 0.0
    with open(log, errors="replace") as lines:
        for line in lines:
            match = LINE.match(line)
            if not match:
                continue
            duration = float(match.group(1)) * UNIT[match.group(2)]
            name = match.group(3).strip()[:110]
            totals[name][0] += 1
            totals[name][1] += duration
            launches += 1
            seconds += duration
    print(f"== {title}: {launches} kernel launches, {seconds * 1e3:.1f} ms of kernel time (waits included)")
    for name, (count, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        share = 100 * total / max(seconds, 1e-12)
        print(f"{total * 1e3:9.2f} ms {share:5.1f}% {count:7d}x {total / count * 1e6:8.1f} us  {name}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
