"""TRL `GRPOTrainer` seconds per step for `cargo xtask bench grpo`, on the same checkpoint as
rein's case (in Hugging Face format), the same prompts and the same settings as rein's side
(benches/src/grpo.rs): 8 prompts x COMPLETIONS completions of up to MAX_TOKENS new tokens
(sampling at temperature 1, no top-k / top-p / min-p, stopping at end-of-sequence), beta = 0
(no reference model), one gradient step per batch (num_iterations 1), clipping epsilon 0.2 on
both sides, rewards scaled by the group's std, loss aggregated per sequence then over
sequences (TRL's loss_type "grpo" = rein's default `seq-mean-token-mean`; TRL's own default
is "dapo"), AdamW (LR constant, eps 1e-8, no weight decay), gradient clipping at 1.0, float32,
`--threads` torch threads; with --lora-rank, PEFT LoRA adapters of that rank and alpha on every
linear layer ("all-linear", no dropout), the base frozen, as rein's `[lora]`.

Gradient checkpointing: TRL 1.x turns it on by default (`gradient_checkpointing=True` in
trl/trainer/base_config.py), which recomputes every forward in the backward pass (and in
older TRL also dropped the KV cache while generating in training mode, TRL issue #3683).
rein does not checkpoint, so this peer runs TRL with `gradient_checkpointing=False`;
`--gradient-checkpointing` reproduces TRL's default, for a second row.

The reward is the same check as rein's `math-answer` plugin with `extract = "answer"` (the text
in <answer> equals the reference), in plain Python, as TRL calls reward functions; with
`--rein-reward DIR`, the plugin itself, sandboxed, through `rein_sandbox.trl.reward_fn`.

Steps: `max_steps = warmup + steps`; a step is timed from `on_step_begin` to `on_step_end`
(generation, reward, loss, backward, optimiser); the first `--warmup` steps are left out and
the figure is the true median of the other `--steps`.

Usage: trl_grpo.py CHECKPOINT_DIR PROMPTS_JSONL [--steps 3] [--warmup 1] [--completions 8]
       [--max-tokens 32] [--lr 1e-5] [--lora-rank R --lora-alpha A]
       [--gradient-checkpointing] [--rein-reward DIR] [--threads 2]
PROMPTS_JSONL: one {"prompt": text, "answer": text} per line; at least 8 * (warmup + steps).
Prints one JSON object: {"seconds_per_step", "step_seconds", "warmup_seconds", "steps",
"warmup", "mean_completion_tokens", "completion_tokens", "peak_rss_mib",
"gradient_checkpointing", "checkpointing_active" (the model's own flag after training),
"loss_type", "reward", "reward_means" (TRL's logged mean reward per step), "lora_rank",
"threads", "blas", "versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import accelerate  # noqa: E402
import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
PROMPTS_PER_STEP = 8


def correct(completions, answer, **_):
    scores = []
    for text, reference in zip(completions, answer):
        found = ANSWER.search(text)
        scores.append(1.0 if found and found.group(1).strip() == reference.strip() else 0.0)
    return scores


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("prompts")
    peer_common.add_step_arguments(parser, steps=3)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--lora-rank", type=int)
    parser.add_argument("--lora-alpha", type=float)
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's default (recomputes the forward in the backward); off unless given",
    )
    parser.add_argument("--output-dir", default="target/bench/trl-grpo", help="TRL's output_dir (nothing is saved)")
    parser.add_argument(
        "--rein-reward",
        metavar="DIR",
        help="score with rein's math-answer plugin through rein_sandbox.trl (installed in DIR) "
        "instead of the plain Python function",
    )
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    total_steps = args.warmup + args.steps
    rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8") if line.strip()]
    if len(rows) < PROMPTS_PER_STEP * total_steps:
        peer_common.log(f"warning: {len(rows)} prompts for {total_steps} steps of {PROMPTS_PER_STEP}: some repeat")
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    peft_config, used = None, [torch, transformers, trl, datasets, accelerate]
    if args.lora_rank:
        import peft

        peft_config = peft.LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha or args.lora_rank,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        used.append(peft)
    checkpointing = peer_common.checkpointing_settings(GRPOConfig, args.gradient_checkpointing)
    config = GRPOConfig(
        **checkpointing,
        output_dir=args.output_dir,
        per_device_train_batch_size=PROMPTS_PER_STEP * args.completions,
        num_generations=args.completions,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        repetition_penalty=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        epsilon_high=0.2,
        scale_rewards="group",
        loss_type="grpo",
        mask_truncated_completions=False,
        **peer_common.trl_schedule(args.lr, total_steps),
    )
    timer = peer_common.trainer_step_timer()
    reward = correct
    if args.rein_reward:
        sys.path.insert(0, args.rein_reward)
        import rein_sandbox
        from rein_sandbox.trl import reward_fn

        reward = reward_fn("math-answer", {"extract": "answer"}, name="correct")
        used.append(rein_sandbox)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
    )
    trainer.train()
    lengths = [
        entry["completions/mean_length"]
        for entry in trainer.state.log_history
        if "completions/mean_length" in entry
    ]
    timed_lengths = lengths[args.warmup:]
    out.emit({
        **peer_common.trainer_step_result(trainer, timer, args, torch),
        "mean_completion_tokens": sum(timed_lengths) / len(timed_lengths) if timed_lengths else None,
        "completion_tokens": timed_lengths,
        "loss_type": config.loss_type,
        "reward": "rein_sandbox" if args.rein_reward else "python",
        "reward_means": [e["rewards/correct/mean"] for e in trainer.state.log_history if "rewards/correct/mean" in e],
        "lora_rank": args.lora_rank,
        "versions": peer_common.versions(*used),
    })


if __name__ == "__main__":
    main()
