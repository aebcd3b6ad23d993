"""TRL `DistillationTrainer` seconds per step for `cargo xtask bench rewards`: on-policy
distillation of the student CHECKPOINT_DIR toward TEACHER_DIR (both in Hugging Face format),
with the same prompts and settings as rein's side (benches/src/grpo.rs, `distillation`): each
step samples one completion of up to MAX_TOKENS new tokens for each of 8 prompts × COMPLETIONS
rows (the prompts file repeats each prompt COMPLETIONS times in a row, so both sides sample the
same 64 completions per step), at temperature 1 with no top-k / top-p, and takes one gradient
step on the reverse KL(student ‖ teacher) over the whole vocabulary (beta = 1.0), averaged over
the completion tokens; AdamW (LR constant, eps 1e-8, no weight decay), gradient clipping at 1.0,
float32, `--threads` torch threads, without gradient checkpointing unless
`--gradient-checkpointing` (TRL's default) is given.

A step is timed from `on_step_begin` to `on_step_end` (generation, the teacher's forward, loss,
backward, optimiser); the first `--warmup` steps are left out and the figure is the true median
of the other `--steps`.

Usage: trl_distill.py CHECKPOINT_DIR TEACHER_DIR PROMPTS_JSONL [--steps 3] [--warmup 1]
       [--completions 8] [--max-tokens 32] [--lr 1e-5] [--gradient-checkpointing] [--threads 2]
Prints one JSON object: {"seconds_per_step", "step_seconds", "warmup_seconds", "steps", "warmup",
"peak_rss_mib", "gradient_checkpointing", "checkpointing_active", "beta", "threads", "blas",
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
from trl import DistillationConfig, DistillationTrainer  # noqa: E402

PROMPTS_PER_STEP = 8


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("teacher")
    parser.add_argument("prompts")
    peer_common.add_step_arguments(parser, steps=3)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off unless given")
    parser.add_argument("--output-dir", default="target/bench/trl-distill", help="TRL's output_dir (nothing is saved)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    total_steps = args.warmup + args.steps
    prompts = [json.loads(line)["prompt"] for line in open(args.prompts, encoding="utf-8") if line.strip()]
    rows = [{"prompt": p} for p in prompts[: PROMPTS_PER_STEP * total_steps] for _ in range(args.completions)]
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32)
    checkpointing = peer_common.checkpointing_settings(DistillationConfig, args.gradient_checkpointing)
    config = DistillationConfig(
        **checkpointing,
        output_dir=args.output_dir,
        per_device_train_batch_size=PROMPTS_PER_STEP * args.completions,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=1.0,
        **peer_common.trl_schedule(args.lr, total_steps),
    )
    timer = peer_common.trainer_step_timer()
    trainer = DistillationTrainer(
        model=model,
        teacher_model=teacher,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    out.emit({
        **peer_common.trainer_step_result(trainer, timer, args, torch),
        "beta": config.beta,
        "versions": peer_common.versions(torch, transformers, trl, datasets, accelerate),
    })


if __name__ == "__main__":
    main()
