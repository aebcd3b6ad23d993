"""A plain PyTorch supervised fine-tuning loop for `cargo xtask bench sft`: the same checkpoint
(the default recipe's tiny Qwen2, saved by the bench in Hugging Face format), the same examples
(prompt and target token ids), the same batch size, AdamW (eps 1e-8) with the recipe's learning
rate and weight decay, gradient clipping; 2 torch threads. Each step draws a random batch,
right-pads prompt + target, and takes transformers' cross-entropy over the target tokens only
(labels -100 elsewhere), as a hand-written loop would.

Usage: torch_sft.py CHECKPOINT_DIR EXAMPLES_JSONL STEPS BATCH LR WEIGHT_DECAY MAX_GRAD_NORM PAD_ID
prints one JSON object with target tokens per second.
"""

import json
import random
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    checkpoint, examples_path = sys.argv[1], sys.argv[2]
    steps, batch = int(sys.argv[3]), int(sys.argv[4])
    lr, weight_decay, max_grad_norm = float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
    pad_id = int(sys.argv[8])
    torch.set_num_threads(2)
    torch.manual_seed(1)
    examples = [json.loads(line) for line in open(examples_path)]
    examples = [e for e in examples if e["target"]]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8, weight_decay=weight_decay)
    rng = random.Random(1)
    tokens = 0
    start = time.perf_counter()
    for _ in range(steps):
        picked = [rng.choice(examples) for _ in range(batch)]
        width = max(len(e["prompt"]) + len(e["target"]) for e in picked)
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        for row, e in enumerate(picked):
            p, t = e["prompt"], e["target"]
            ids[row, : len(p) + len(t)] = torch.tensor(p + t)
            mask[row, : len(p) + len(t)] = 1
            labels[row, len(p) : len(p) + len(t)] = torch.tensor(t)
            tokens += len(t)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "tokens_per_s": tokens / seconds,
                "seconds": seconds,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            }
        )
    )


if __name__ == "__main__":
    main()
