"""TRL `GRPOTrainer` seconds per step for `cargo xtask bench grpo`, on the same random Qwen2
checkpoint (saved by the bench in Hugging Face format), the same prompts and the same settings:
8 prompts x 8 completions of 32 new tokens, beta = 0, one gradient step per batch, AdamW
(lr 1e-5, eps 1e-8, no weight decay), gradient clipping at 1.0, 2 torch threads.

The reward is the same check as rein's `math-answer` plugin (the text in <answer> equals the
reference), in plain Python, as TRL calls reward functions.

Usage: trl_grpo.py CHECKPOINT_DIR PROMPTS_JSONL STEPS   prints one JSON object
"""

import json
import re
import resource
import sys
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
    checkpoint, prompts_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in open(prompts_path)]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = GRPOConfig(
        output_dir="target/bench/trl-grpo",
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=32,
        temperature=1.0,
        beta=0.0,
        learning_rate=1e-5,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        max_steps=steps + 1,
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
    )
    trainer.train()
    measured = sorted(timer.times[1:])  # the first step warms up
    print(json.dumps({
        "seconds_per_step": measured[len(measured) // 2],
        "steps": len(measured),
        # The process's peak resident set (Linux reports KiB).
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }))


if __name__ == "__main__":
    main()
