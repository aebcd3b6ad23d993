"""HF transformers scoring with a reward model on this machine, for `cargo xtask bench rewards`:
completions scored per second by `AutoModelForSequenceClassification` on the checkpoint the
bench scores with rein, over the same rendered texts.

`--create DIR --tokenizer TOK`: first writes the checkpoint: a random Qwen2ForSequenceClassification
(hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 512, one label; seed 0, weights N(0, 0.02)) with
the tokenizer files of TOK, and prints {"created": DIR}.

Scoring, as rein's side does it (benches/src/rewards.rs): the texts sorted by token length, in
batches of `--batch`, right-padded, no special tokens added (as TRL feeds reward models), float32,
`--threads` torch threads, under `torch.inference_mode()`; the score is `logits[:, 0]`. A step
scores every text once; `--warmup` untimed steps, then `--steps` timed ones; completions/s = texts
/ the true median step time.

Usage: hf_reward_model.py CHECKPOINT_DIR TEXTS_JSON [--batch 16] [--steps 5] [--warmup 1] [--threads 2]
       hf_reward_model.py --create DIR --tokenizer TOKENIZER_DIR
TEXTS_JSON: a JSON list of strings.
Prints one JSON object: {"completions_per_s", "median_seconds", "step_seconds", "scores" (in the
texts' order), "texts", "batch", "warmup", "steps", "threads", "blas", "versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification  # noqa: E402


def create(path, tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, rope_theta=10000.0,
                         num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(path, safe_serialization=True)
    for f in pathlib.Path(tokenizer_dir).iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, pathlib.Path(path) / f.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?")
    parser.add_argument("texts", nargs="?")
    parser.add_argument("--create")
    parser.add_argument("--tokenizer")
    parser.add_argument("--batch", type=int, default=16)
    peer_common.add_step_arguments(parser, steps=5)
    peer_common.add_threads_argument(parser)
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    if args.create:
        create(args.create, args.tokenizer)
        out.emit({"created": args.create, "versions": peer_common.versions(torch, transformers)})
        return
    texts = json.load(open(args.texts, encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
    scores = [0.0] * len(texts)
    times = []
    with torch.inference_mode():
        for step in range(args.warmup + args.steps):
            start = time.perf_counter()
            for batch in batches:
                inputs = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True, padding_side="right",
                                   add_special_tokens=False)
                logits = model(**inputs).logits[:, 0]
                for i, score in zip(batch, logits.tolist()):
                    scores[i] = score
            elapsed = time.perf_counter() - start
            if step >= args.warmup:
                times.append(elapsed)
    median = peer_common.median(times)
    out.emit({
        "completions_per_s": len(texts) / median,
        "median_seconds": median,
        "step_seconds": times,
        "scores": scores,
        "texts": len(texts),
        "batch": args.batch,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(torch, transformers),
    })


if __name__ == "__main__":
    main()
