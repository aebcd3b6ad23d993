"""Merges the GPU check's rows (rein-gpu-check, the PyTorch peers, PPO on CartPole, and both
sides' speed rows on the large checkpoint) into results.json and prints them as one table.
Exit status 1 if a parity row failed or is missing.

    python3 summary.py REIN PEERS PPO OUT [--large REIN_LARGE PEERS_LARGE]
"""

import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def peak_memory(path):
    """Peak device memory (MiB) above the first reading in an nvidia-smi sample file, or None."""
    try:
        readings = [int(line) for line in open(path) if line.strip().isdigit()]
    except OSError:
        return None
    return max(readings) - readings[0] if readings else None


def memory_rows(prefix, sides):
    """A row of peak device memory for each (side, sample file) that has readings."""
    rows = []
    for side, path in sides:
        peak = peak_memory(path)
        if peak is not None:
            rows.append({"check": f"{prefix}peak device memory, {side}", "kind": "speed", "value": peak / 1024,
                         "unit": "GiB", "bound": None, "ok": True,
                         "detail": "nvidia-smi every 100 ms, above the reading at start (CUDA context included)"})
    return rows


def large_rows(rein_path, peers_path):
    """Both sides' speed rows on the large checkpoint, named after it, and each side's peak memory."""
    rows = []
    for path in (rein_path, peers_path):
        for row in (load(path) or {}).get("rows", []):
            if row["kind"] == "speed":
                rows.append(dict(row, check=f"qwen2.5-0.5b: {row['check']}", ok=row.get("ok", True), bound=None))
    return rows + memory_rows("qwen2.5-0.5b: ", (("rein-gpu-check", "rein-large-memory.txt"),
                                                ("PyTorch peers", "peers-large-memory.txt")))


def main(rein_path, peers_path, ppo_path, out_path, large=None):
    rein = load(rein_path)
    peers = load(peers_path)
    ppo = load(ppo_path)
    rows = list(rein["rows"]) if rein else []
    if not rein:
        rows.append({"check": "rein-gpu-check", "kind": "parity", "value": None, "unit": "", "bound": None,
                     "ok": False, "detail": f"no {rein_path}: it did not start (see rein.log)"})
    if ppo is not None:
        log = open("ppo.log").read() if os.path.exists("ppo.log") else ""
        reached = re.search(r"reached return ([0-9.]+) ≥ ([0-9.]+) at step (\d+)", log)
        detail = (f"return {reached.group(1)} ≥ {reached.group(2)} at env step {reached.group(3)}"
                  if reached else f"exit status {ppo['status']}; see ppo.log")
        rows.append({"check": "ppo cartpole on cuda reaches 475", "kind": "parity",
                     "value": ppo["seconds"], "unit": "s", "bound": None,
                     "ok": ppo["status"] == 0 and reached is not None, "detail": detail})
    for row in (peers or {}).get("rows", []):
        rows.append(dict(row, ok=True, bound=None))
    rows.extend(memory_rows("", (("rein-gpu-check (every row)", "rein-memory.txt"),
                                 ("PyTorch peers (every row)", "peers-memory.txt"))))
    if large:
        rows.extend(large_rows(*large))
    versions = {"torch": (peers or {}).get("torch"), "cuda": (peers or {}).get("cuda")}
    with open(out_path, "w") as f:
        json.dump({"device": rein["device"] if rein else None, "versions": versions, "rows": rows}, f, indent=1)

    print(f"\n{'':6} {'check':<60} {'value':>16} {'bound':>8}  detail")
    for row in rows:
        kind = row["kind"]
        status = {"parity": "ok" if row["ok"] else "FAIL", "speed": "speed" if row["ok"] else "error",
                  "info": "info"}[kind]
        value = row.get("value")
        if value is None or value != value:
            shown = "-"
        elif value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e6):
            shown = f"{value:.3e} {row['unit']}"
        else:
            shown = f"{value:.3f} {row['unit']}"
        bound = "" if row.get("bound") is None else f"{row['bound']:.0e}"
        print(f"{status:<6} {row['check']:<60} {shown:>16} {bound:>8}  {row['detail']}")
    parity = [r for r in rows if r["kind"] == "parity"]
    failed = [r for r in parity if not r["ok"]]
    print(f"{len(parity)} parity rows, {len(failed)} failed; written to {out_path}")
    return 1 if failed or not parity else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    large = args[args.index("--large") + 1:args.index("--large") + 3] if "--large" in args else None
    sys.exit(main(*args[:4], large=large))
