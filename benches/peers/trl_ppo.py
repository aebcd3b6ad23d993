"""TRL `PPOTrainer` seconds per step for `cargo xtask bench preferences`: PPO with a value model
on POLICY_DIR (Hugging Face format; also the frozen reference, loaded a second time) against
the reward model REWARD_DIR (a one-label `*ForSequenceClassification`, also the value model's
start, TRL's default), on the prompts of PROMPTS_JSONL, as rein's side (benches/src/lm_ppo.rs):
BATCH prompts per step, one completion each of up to MAX_TOKENS new tokens (temperature 0.7,
no top-k / top-p, stopping at end-of-sequence), `num_ppo_epochs` 4 over one minibatch, KL
penalty 0.05 (k1) in the reward, γ 1, λ 0.95, clip ranges 0.2, value coefficient 0.1 (TRL's
defaults), AdamW (LR constant, eps 1e-8, no weight decay), float32 (no bf16 autocast),
`--threads` torch threads, without gradient checkpointing (`PPOTrainer.train` is its own loop
and never turns it on, whatever the flag).

TRL 1.x no longer ships `PPOTrainer`; TRL 0.29's (`trl.experimental.ppo`, which runs on the
venv's transformers 5) is read from `.venv/trl-0.29`:

    .venv/bin/pip install --no-deps --target .venv/trl-0.29 trl==0.29.0

A step is one of TRL's PPO updates: generation, the policy's, reference's, value model's and
reward model's forward passes, then the PPO epochs. TRL calls no `on_step_begin` there, so a
step is timed from the previous step's `on_step_end` (the first from `on_train_begin`); the
first `--warmup` steps are left out and the figure is the true median of the other `--steps`.

Usage: trl_ppo.py POLICY_DIR REWARD_DIR PROMPTS_JSONL [--steps 3] [--warmup 1] [--batch 8]
       [--max-tokens 32] [--lr 1e-5] [--threads 2]
PROMPTS_JSONL: one {"prompt": text} per line (the chat template already applied).
Prints one JSON object: {"seconds_per_step", "step_seconds", "warmup_seconds", "steps", "warmup",
"eos_per_step" (completions that stopped), "peak_rss_mib", "gradient_checkpointing", "checkpointing_active",
"threads", "blas", "versions"}.
"""

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TRL_0_29 = HERE.parent.parent / ".venv" / "trl-0.29"
sys.path.insert(0, str(TRL_0_29))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import accelerate  # noqa: E402
import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

try:
    from trl.experimental.ppo import PPOConfig, PPOTrainer  # noqa: E402
except ImportError as error:
    sys.exit(
        f"TRL {trl.__version__} has no PPOTrainer ({error}): install TRL 0.29's with "
        f"`.venv/bin/pip install --no-deps --target {TRL_0_29} trl==0.29.0`"
    )


def update_timer():
    """Times each PPO update from the previous `on_step_end` (the first from `on_train_begin`)."""

    class UpdateTimes(transformers.TrainerCallback):
        def __init__(self):
            self.times, self.last = [], None

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    return UpdateTimes()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy")
    parser.add_argument("reward_model")
    parser.add_argument("prompts")
    peer_common.add_step_arguments(parser, steps=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--output-dir", default="target/bench/trl-ppo", help="TRL's output_dir (nothing is saved)")
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    total_steps = args.warmup + args.steps
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8") if line.strip()]
    rows = rows[: args.batch * total_steps]
    ids = [tokenizer(row["prompt"], add_special_tokens=False)["input_ids"] for row in rows]
    dataset = Dataset.from_list([{"input_ids": i} for i in ids])
    load = lambda cls, path, **kw: cls.from_pretrained(path, dtype=torch.float32, **kw)  # noqa: E731
    policy = load(AutoModelForCausalLM, args.policy)
    reference = load(AutoModelForCausalLM, args.policy)
    value_model = load(AutoModelForSequenceClassification, args.reward_model, num_labels=1)
    reward_model = load(AutoModelForSequenceClassification, args.reward_model, num_labels=1)
    args.gradient_checkpointing = False
    checkpointing = peer_common.checkpointing_settings(PPOConfig, False)
    schedule = peer_common.trl_schedule(args.lr, total_steps)
    for key in ("shuffle_dataset", "max_steps"):
        schedule.pop(key, None)
    config = PPOConfig(
        **checkpointing,
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch,
        local_rollout_forward_batch_size=args.batch,
        num_mini_batches=1,
        num_ppo_epochs=4,
        total_episodes=args.batch * total_steps,
        response_length=args.max_tokens,
        stop_token="eos",
        temperature=0.7,
        kl_coef=0.05,
        kl_estimator="k1",
        num_sample_generations=0,
        **schedule,
    )
    timer = update_timer()
    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=reference,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=dataset,
        callbacks=[timer],
    )
    trainer.train()
    lengths = [e["val/num_eos_tokens"] for e in trainer.state.log_history if "val/num_eos_tokens" in e]
    out.emit({
        **peer_common.trainer_step_result(trainer, timer, args, torch),
        "eos_per_step": lengths,
        "versions": peer_common.versions(torch, transformers, trl, datasets, accelerate),
    })


if __name__ == "__main__":
    main()
