"""Sums a cubecl profiling log (`[profiling.logger] level = "basic"`: one `| duration | kernel`
line per launch, each launch waited for) by kernel: launches, total time, share, mean. Then,
with the profiled run's rows (its forward passes or steps, and its cuBLAS calls, which the log
does not see), adds to the bundle's results the launches per generated token or per GRPO step,
and the µs per launch that the unprofiled timing in the results gives. Written into the GPU
bundle by `cargo xtask gpu-bundle`; `run.sh` runs it.

    python3 profile.py LOG TITLE RUN_JSON RESULTS_JSON

TITLE is `generation` or `step`. The durations in the log include each launch's wait, so they
are not the run's timings; the counts are.
"""

import collections
import json
import re
import sys

UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
LINE = re.compile(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)")


def count(log, title, top=30):
    """Prints the launches per kernel; returns the number of launches."""
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
    for name, (n, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        share = 100 * total / max(seconds, 1e-12)
        print(f"{total * 1e3:9.2f} ms {share:5.1f}% {n:7d}x {total / n * 1e6:8.1f} us  {name}")
    return launches


def info_sum(rows, suffix):
    """The sum of the info rows whose check ends with `suffix` (their detail is a count)."""
    return sum(int(r["detail"]) for r in rows if r["kind"] == "info" and r["check"].endswith(suffix))


def speed_row(rows, prefix):
    """The first speed row whose check starts with `prefix` and has a value, or None."""
    for r in rows:
        if r["kind"] == "speed" and r["check"].startswith(prefix) and r.get("value") == r.get("value"):
            return r
    return None


def per_unit(title, launches, run_rows, results_rows):
    """The rows: launches per generated token (or GRPO step), and µs per launch."""
    cublas = info_sum(run_rows, "products: cuBLAS calls")
    if title == "generation":
        units, what = info_sum(run_rows, ": forward passes run"), "generated token (one forward pass)"
        timed = speed_row(results_rows, "rein generate f32, batch 1")
        seconds_per_unit = 1 / timed["value"] if timed else None
    else:
        units, what = info_sum(run_rows, ": steps run"), "GRPO step"
        timed = speed_row(results_rows, "rein grpo step f32,")
        seconds_per_unit = timed["value"] / 1e3 if timed and ":" not in timed["check"] else None
    if not units:
        return []
    per = (launches + cublas) / units
    rows = [{"check": f"rein launches per {what}", "kind": "speed", "value": per, "unit": "launches",
             "bound": None, "ok": True,
             "detail": f"{launches} CubeCL kernels + {cublas} cuBLAS calls over {units} (profiled run)"}]
    if seconds_per_unit and per:
        rows.append({"check": f"rein µs per launch, {timed['check']}", "kind": "speed",
                     "value": seconds_per_unit / per * 1e6, "unit": "µs", "bound": None, "ok": True,
                     "detail": "the unprofiled time per unit over the launches per unit"})
    return rows


def main(log, title, run_path, results_path):
    launches = count(log, title)
    try:
        run_rows = json.load(open(run_path))["rows"]
        results = json.load(open(results_path))
    except (OSError, ValueError, KeyError) as e:
        print(f"no per-{title} figures: {e}")
        return
    rows = per_unit(title, launches, run_rows, results["rows"])
    for row in rows:
        print(f"speed  {row['check']:<60} {row['value']:>10.1f} {row['unit']}  {row['detail']}")
    results["rows"].extend(rows)
    with open(results_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
