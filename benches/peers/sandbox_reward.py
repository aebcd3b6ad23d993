"""The `math-answer` reward through rein's Python package (`rein_sandbox.trl.reward_fn`, the
sandboxed Rust plugin called from Python as TRL calls reward functions), and math-verify (the
checker TRL's and open-r1's accuracy rewards use) on the same completions, for
`cargo xtask bench plugins`.

TRL calls a reward function once per batch with every completion of the batch; here a batch is
64 groups of 8 (512 completions), as rein's own side scores them. math-verify has no batch
call: its `verify(parse(gold), parse(answer))` runs per completion, gold parsed once per group.

Usage: sandbox_reward.py GROUPS.jsonl --sandbox-path DIR [--math-verify-path DIR]
       [--steps 5] [--warmup 1] [--threads N]
DIR: a folder holding the installed package (`pip install --target`). GROUPS.jsonl: one
{"completions": [...], "reference": "..."} per line.
Prints one JSON object: {"adapter_completions_per_s", "adapter_step_seconds",
"math_verify_completions_per_s" (absent without --math-verify-path), "math_verify_step_seconds",
"math_verify_agreement" (fraction of completions where both checks agree), "completions",
"threads", "versions"}. Both run on the calling thread ("threads": 1).
"""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

BATCH_GROUPS = 64


def timed(args, one_pass):
    times = []
    result = None
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        result = one_pass()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    return peer_common.median(times), times, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", help="JSONL of {completions, reference}")
    parser.add_argument("--sandbox-path", required=True, help="folder holding rein_sandbox")
    parser.add_argument("--math-verify-path", help="folder holding math_verify")
    peer_common.add_step_arguments(parser, steps=5, what="passes over every group")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    sys.path.insert(0, args.sandbox_path)
    import rein_sandbox
    from rein_sandbox.trl import reward_fn

    groups = [json.loads(line) for line in open(args.groups, encoding="utf-8") if line.strip()]
    total = sum(len(g["completions"]) for g in groups)
    fn = reward_fn("math-answer")
    batches = []
    for start in range(0, len(groups), BATCH_GROUPS):
        chunk = groups[start : start + BATCH_GROUPS]
        prompts = [f"problem {start + i}" for i, g in enumerate(chunk) for _ in g["completions"]]
        completions = [c for g in chunk for c in g["completions"]]
        references = [g["reference"] for g in chunk for _ in g["completions"]]
        batches.append((prompts, completions, references))

    def adapter_pass():
        return [s for p, c, r in batches for s in fn(p, c, None, reference=r)]

    adapter_median, adapter_times, adapter_scores = timed(args, adapter_pass)
    used = [rein_sandbox]
    result = {
        "adapter_completions_per_s": total / adapter_median,
        "adapter_step_seconds": adapter_times,
        "completions": total,
        "threads": 1,
    }
    if args.math_verify_path:
        sys.path.insert(0, args.math_verify_path)
        import math_verify
        from math_verify import parse, verify

        def math_verify_pass():
            scores = []
            for g in groups:
                gold = parse(g["reference"])
                scores.extend(float(verify(gold, parse(c))) for c in g["completions"])
            return scores

        mv_median, mv_times, mv_scores = timed(args, math_verify_pass)
        agree = sum(a == b for a, b in zip(adapter_scores, mv_scores)) / total
        result.update(
            math_verify_completions_per_s=total / mv_median,
            math_verify_step_seconds=mv_times,
            math_verify_agreement=agree,
        )
        used.append(math_verify)
    result["versions"] = peer_common.versions(*used)
    out.emit(result)


if __name__ == "__main__":
    main()
