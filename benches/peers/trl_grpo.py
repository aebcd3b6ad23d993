"""TRL `GRPOTrainer` seconds per step for `cargo xtask bench grpo`, on the same checkpoint as
rein's case (in Hugging Face format), the same prompts and the same settings: 8 prompts x
COMPLETIONS completions of up to MAX_TOKENS new tokens, beta = 0, one gradient step per batch,
AdamW (LR, eps 1e-8, no weight decay), gradient clipping at 1.0, 2 torch threads; with
--lora-rank, PEFT LoRA adapters of that rank and alpha on every linear layer ("all-linear"),
the base frozen, as rein's `[lora]`.

The reward is the same check as rein's `math-answer` plugin (the text in <answer> equals the
reference), in plain Python, as TRL calls reward functions.

Usage: trl_grpo.py CHECKPOINT_DIR PROMPTS_JSONL STEPS [--completions 8] [--max-tokens 32]
       [--lr 1e-5] [--lora-rank R --lora-alpha A]
prints one JSON object: the median step time after the first step, the mean completion
length over those steps, the process's peak resident memory and the versions.
"""

import argparse
import json
import re
import resource
import time

import torch
import transformers
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def correct(completions, answer, **_):
    scores = []
    for text, reference in zip(completions, answer):
        found = ANSWER.search(text)
        scores.append(1.0 if found and found.group(1).strip() == reference.strip() else 0.0)
    return scores


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.last = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.last)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("prompts")
    parser.add_argument("steps", type=int)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--lora-rank", type=int)
    parser.add_argument("--lora-alpha", type=float)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in open(args.prompts)]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    peft_config, versions = None, {}
    if args.lora_rank:
        import peft

        peft_config = peft.LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha or args.lora_rank,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        versions["peft"] = peft.__version__
    config = GRPOConfig(
        output_dir="target/bench/trl-grpo",
        per_device_train_batch_size=8 * args.completions,
        num_generations=args.completions,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        beta=0.0,
        learning_rate=args.lr,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        max_steps=args.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=1,
        shuffle_dataset=False,
    )
    timer = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=correct,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
    )
    trainer.train()
    measured = sorted(timer.times[1:])  # the first step warms up
    lengths = [
        entry["completions/mean_length"]
        for entry in trainer.state.log_history
        if "completions/mean_length" in entry
    ][1:]
    versions.update({"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__})
    print(json.dumps({
        "seconds_per_step": measured[len(measured) // 2],
        "steps": len(measured),
        "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else None,
        # The process's peak resident set (Linux reports KiB).
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "versions": versions,
    }))


if __name__ == "__main__":
    main()
