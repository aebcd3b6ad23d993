"""A plain PyTorch supervised fine-tuning loop for `cargo xtask bench sft`: the same checkpoint
(the default recipe's tiny Qwen2, saved by the bench in Hugging Face format), the same examples
(prompt and target token ids), the same batch size, AdamW (eps 1e-8) with the recipe's learning
rate and weight decay, gradient clipping; float32, `--threads` torch threads. Each step draws a
random batch, right-pads prompt + target, and takes transformers' cross-entropy over the target
tokens only (labels -100 elsewhere), as a hand-written loop would.

`--warmup` untimed steps, then `--steps` timed ones. Each timed step's rate is its target
tokens over its seconds; `tokens_per_s` is the true median of those rates, `mean_tokens_per_s`
all timed target tokens over all timed seconds.

Usage: torch_sft.py CHECKPOINT_DIR EXAMPLES_JSONL --batch B --lr LR --weight-decay WD
       --max-grad-norm G --pad-id ID [--steps 40] [--warmup 1] [--threads 2]
EXAMPLES_JSONL: one {"prompt": [ids], "target": [ids]} per line.
Prints one JSON object: {"tokens_per_s", "mean_tokens_per_s", "median_step_seconds",
"step_seconds", "step_tokens", "steps", "warmup", "batch", "threads", "blas", "versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("examples")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--weight-decay", type=float, required=True)
    parser.add_argument("--max-grad-norm", type=float, required=True)
    parser.add_argument("--pad-id", type=int, required=True)
    peer_common.add_step_arguments(parser, steps=40)
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    torch.manual_seed(1)
    examples = [json.loads(line) for line in open(args.examples, encoding="utf-8") if line.strip()]
    examples = [e for e in examples if e["target"]]
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=1e-8, weight_decay=args.weight_decay)
    rng = random.Random(1)
    times, tokens = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        picked = [rng.choice(examples) for _ in range(args.batch)]
        width = max(len(e["prompt"]) + len(e["target"]) for e in picked)
        ids = torch.full((args.batch, width), args.pad_id, dtype=torch.long)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        labels = torch.full((args.batch, width), -100, dtype=torch.long)
        step_tokens = 0
        for row, e in enumerate(picked):
            p, t = e["prompt"], e["target"]
            ids[row, : len(p) + len(t)] = torch.tensor(p + t)
            mask[row, : len(p) + len(t)] = 1
            labels[row, len(p) : len(p) + len(t)] = torch.tensor(t)
            step_tokens += len(t)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
            tokens.append(step_tokens)
    out.emit({
        "tokens_per_s": peer_common.median([n / s for n, s in zip(tokens, times)]),
        "mean_tokens_per_s": sum(tokens) / sum(times),
        "median_step_seconds": peer_common.median(times),
        "step_seconds": times,
        "step_tokens": tokens,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(torch, transformers),
    })


if __name__ == "__main__":
    main()
