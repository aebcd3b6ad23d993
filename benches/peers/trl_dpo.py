"""TRL `DPOTrainer` seconds per step for `cargo xtask bench preferences`: DPO (the sigmoid loss,
β = 0.1) of CHECKPOINT_DIR (Hugging Face format; also the frozen reference, which TRL loads a
second time) on the preference pairs of PAIRS_JSONL (plain `prompt` / `chosen` / `rejected`
text; TRL appends the end-of-sequence token and tokenizes, as rein does), BATCH pairs per step
in a seeded random order, the reference's log-probabilities computed on every batch
(`precompute_ref_log_probs=False`, TRL's default), AdamW (LR constant, eps 1e-8, no weight decay),
gradient clipping at 1.0, float32 (no bf16 autocast), `--threads` torch threads, without gradient
checkpointing unless `--gradient-checkpointing` (TRL's default) is given.

A step is timed from `on_step_begin` to `on_step_end` (both models' forward passes, loss,
backward, optimiser); the first `--warmup` steps are left out and the figure is the true median
of the other `--steps`.

Usage: trl_dpo.py CHECKPOINT_DIR PAIRS_JSONL [--steps 10] [--warmup 1] [--batch 8] [--lr 1e-6]
       [--gradient-checkpointing] [--threads 2]
Prints one JSON object: {"seconds_per_step", "step_seconds", "warmup_seconds", "steps", "warmup",
"peak_rss_mib", "gradient_checkpointing", "checkpointing_active", "batch", "threads", "blas",
"versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import json  # noqa: E402

import accelerate  # noqa: E402
import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("pairs")
    peer_common.add_step_arguments(parser, steps=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off unless given")
    parser.add_argument("--output-dir", default="target/bench/trl-dpo", help="TRL's output_dir (nothing is saved)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    total_steps = args.warmup + args.steps
    rows = [json.loads(line) for line in open(args.pairs, encoding="utf-8") if line.strip()]
    rows = rows[: args.batch * total_steps]
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    checkpointing = peer_common.checkpointing_settings(DPOConfig, args.gradient_checkpointing)
    schedule = peer_common.trl_schedule(args.lr, total_steps)
    # DPOConfig has no `shuffle_dataset`: its trainer draws the pairs in a seeded random order.
    schedule.pop("shuffle_dataset")
    config = DPOConfig(
        **checkpointing,
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch,
        beta=0.1,
        loss_type=["sigmoid"],
        precompute_ref_log_probs=False,
        **schedule,
    )
    timer = peer_common.trainer_step_timer()
    trainer = DPOTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    out.emit({
        **peer_common.trainer_step_result(trainer, timer, args, torch),
        "batch": args.batch,
        "versions": peer_common.versions(torch, transformers, trl, datasets, accelerate),
    })


if __name__ == "__main__":
    main()
