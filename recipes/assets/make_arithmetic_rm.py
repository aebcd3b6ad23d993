"""Make `recipes/assets/arithmetic-rm`: the reward model of `recipes/grpo-reward-model.toml`.

    cargo xtask run recipes/grpo-arithmetic.toml          # the main job: its run directory has
                                                            # `sft/` (the policy before RL) and `data/`
    .venv/bin/pip install torch transformers safetensors
    .venv/bin/python recipes/assets/make_arithmetic_rm.py runs/grpo-arithmetic-<stamp>

As reward models are usually made (InstructGPT, TRL's `RewardTrainer`): the policy before RL
(`sft/`) samples SAMPLES completions for each of PROMPTS training prompts at the recipe's
temperature; each is labelled by checking its `<answer>` against the reference; every prompt
with a right and a wrong completion gives (chosen, rejected) pairs; a
`Qwen2ForSequenceClassification` initialised from the same policy (a new one-output `score`
head; with `--extra-layers N`, N more decoder layers on top whose output projections start at
zero, so the model starts as the policy's trunk) is trained on them with the Bradley–Terry loss
−log σ(r_chosen − r_rejected). The text it reads is the one rein gives a reward model: the
prompt and the completion as a user and an assistant turn through the chat template. Held-out
pairs (from `data/test.jsonl`) measure its pairwise accuracy. Saved in bfloat16 (rein upcasts
it), with the tokenizer; `metrics.json` beside it records what was measured. `--pairs FILE`
keeps the sampled pairs (and reads them back when FILE exists).

Not a competent reward model, and kept as such: measured 2026-11-26 (2-core AMD EPYC), the
committed one ranks 50% of the held-out pairs right (53% before training, 40% after its first
epoch): chance. An earlier run of the same settings reached 58%, and no variant tried did
reliably better: 12,000 more generated pairs (each worked solution against itself with one step
slipped) with three epochs (48%), lr 2e-3 (50%), four extra layers (47%). The 0.9M-parameter
policy does its arithmetic one token at a time across all its layers; judging a finished
solution in one pass at the last token asks more than its trunk learns from a few thousand
pairs.

Deterministic on one machine (seeded sampling and training); other CPUs may differ in the last
bits of PyTorch's kernels, so a rebuild can differ slightly from the committed weights.
"""

import argparse
import copy
import json
import pathlib
import random
import re

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
PROMPTS, SAMPLES, TEMPERATURE, MAX_NEW_TOKENS = 3000, 4, 0.7, 40
TEST_PROMPTS = 300
EPOCHS, BATCH, LR = 2, 32, 5e-4


def correct(completion, reference):
    found = ANSWER.search(completion)
    return bool(found) and found.group(1).strip() == reference.strip()


def sample(model, tokenizer, rows, seed):
    """SAMPLES completions per row, as text without the end-of-turn token."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    out = []
    for start in range(0, len(rows), 128):
        batch = rows[start : start + 128]
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True)
            for r in batch
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            generated = model.generate(
                **enc,
                do_sample=True,
                temperature=TEMPERATURE,
                top_k=0,
                top_p=1.0,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=SAMPLES,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        completions = tokenizer.batch_decode(generated[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, row in enumerate(batch):
            out.append((row, completions[i * SAMPLES : (i + 1) * SAMPLES]))
    return out


def pairs(sampled):
    """(prompt, chosen, rejected): each right completion against a wrong one of the same prompt."""
    out = []
    for row, completions in sampled:
        right = [c for c in completions if correct(c, row["answer"])]
        wrong = [c for c in completions if not correct(c, row["answer"])]
        for i, chosen in enumerate(right):
            if wrong:
                out.append((row["prompt"], chosen, wrong[i % len(wrong)]))
    return out


def render(tokenizer, prompt, completion):
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def scores(model, tokenizer, texts):
    tokenizer.padding_side = "right"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return model(**enc).logits[:, 0]


def pairwise_accuracy(model, tokenizer, data):
    model.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, len(data), 256):
            batch = data[start : start + 256]
            chosen = scores(model, tokenizer, [render(tokenizer, p, c) for p, c, _ in batch])
            rejected = scores(model, tokenizer, [render(tokenizer, p, r) for p, _, r in batch])
            right += int((chosen > rejected).sum())
    return right / max(len(data), 1)


def deepened(sft, extra):
    """The classifier of `sft` with `extra` decoder layers after its own, each starting as the
    identity (zero output projections), and the policy's final norm after them."""
    torch.manual_seed(1)
    base = AutoModelForSequenceClassification.from_pretrained(sft, num_labels=1, dtype=torch.float32)
    if extra == 0:
        return base
    config = copy.deepcopy(base.config)
    layers = config.num_hidden_layers
    config.num_hidden_layers = layers + extra
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * (layers + extra)
    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all(name.startswith("model.layers.") and int(name.split(".")[2]) >= layers for name in missing), missing
    with torch.no_grad():
        for layer in model.model.layers[layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def cached_pairs(path, make):
    """The pairs in `path`, or `make()`'s, written there."""
    if path and path.exists():
        return json.loads(path.read_text())
    made = make()
    if path:
        path.write_text(json.dumps(made))
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=pathlib.Path, help="a run of recipes/grpo-arithmetic.toml")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "arithmetic-rm")
    parser.add_argument("--pairs", type=pathlib.Path, help="keep the sampled pairs here (read them if it exists)")
    parser.add_argument("--extra-layers", type=int, default=0, help="decoder layers added on top of the policy's")
    args = parser.parse_args()
    torch.set_num_threads(2)
    sft = args.run_dir / "sft"
    read = lambda name: [json.loads(l) for l in open(args.run_dir / "data" / name, encoding="utf-8") if l.strip()]
    train_rows, test_rows = read("train.jsonl")[:PROMPTS], read("test.jsonl")[:TEST_PROMPTS]
    tokenizer = AutoTokenizer.from_pretrained(sft)
    policy = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32).eval()
    both = cached_pairs(
        args.pairs,
        lambda: [pairs(sample(policy, tokenizer, train_rows, seed=1)), pairs(sample(policy, tokenizer, test_rows, seed=2))],
    )
    train_pairs, test_pairs = [[tuple(p) for p in part] for part in both]
    print(f"{len(train_pairs)} training pairs from {len(train_rows)} prompts, {len(test_pairs)} held-out pairs")

    model = deepened(sft, args.extra_layers)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.id2label, model.config.label2id = {0: "correct"}, {"correct": 0}
    before = pairwise_accuracy(model, tokenizer, test_pairs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    random.seed(1)
    torch.manual_seed(1)
    for epoch in range(EPOCHS):
        model.train()
        random.shuffle(train_pairs)
        losses = []
        for start in range(0, len(train_pairs), BATCH):
            batch = train_pairs[start : start + BATCH]
            chosen = scores(model, tokenizer, [render(tokenizer, p, c) for p, c, _ in batch])
            rejected = scores(model, tokenizer, [render(tokenizer, p, r) for p, _, r in batch])
            loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
        accuracy = pairwise_accuracy(model, tokenizer, test_pairs)
        print(f"epoch {epoch + 1}: mean loss {sum(losses) / len(losses):.4f}, held-out pairwise accuracy {accuracy:.3f}")
    # What is saved is what is measured: bfloat16 weights, read back in float32 (as rein does).
    model = model.to(torch.bfloat16).to(torch.float32)
    after = pairwise_accuracy(model, tokenizer, test_pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    metrics = {
        "made_by": f"recipes/assets/make_arithmetic_rm.py, torch {torch.__version__}, transformers {transformers.__version__}",
        "base": f"the policy after the main job's SFT (seed 1), {args.extra_layers} layers added",
        "train_pairs": len(train_pairs),
        "held_out_pairs": len(test_pairs),
        "held_out_pairwise_accuracy_before": before,
        "held_out_pairwise_accuracy": after,
        "settings": {"prompts": PROMPTS, "samples": SAMPLES, "temperature": TEMPERATURE, "epochs": EPOCHS, "batch": BATCH, "lr": LR},
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
