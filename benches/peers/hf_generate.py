"""HF transformers `generate` throughput on this machine, for `cargo xtask bench generate`: new
tokens per second at each batch size, on the checkpoint the bench writes.

Settings as rein's side (benches/src/generate.rs): PROMPT_LEN-token prompts (the ids from
`--prompts`, else random ids in [3, min(vocab, 512)) seeded by the batch size), exactly
NEW_TOKENS new tokens per row (end-of-sequence is never sampled early: `min_new_tokens`, as
rein ignores it), pure sampling at temperature 1 (no top-k, top-p or min-p), float32,
`--threads` torch threads, under `torch.inference_mode()`.

A step is one `generate` call for the whole batch; `--warmup` untimed calls, then `--steps`
timed ones; tokens/s = batch * NEW_TOKENS / the true median step time.

Usage: hf_generate.py CHECKPOINT_DIR BATCH [BATCH ...] [--prompt-len 16] [--new-tokens 128]
       [--steps 5] [--warmup 1] [--prompts PROMPTS.json] [--threads 2]
PROMPTS.json: {"<batch>": [[token id, ...], ...], ...}.
Prints one JSON object: {"batches": {"<batch>": {"tokens_per_s", "median_seconds",
"step_seconds"}, ...}, "prompt_len", "new_tokens", "warmup", "steps", "threads", "blas",
"versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    peer_common.add_generation_arguments(parser, "the checkpoint directory", what="generate calls")
    args = parser.parse_args()
    out = peer_common.Stdout()
    peer_common.configure_torch(torch, args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    sampling = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        pad_token_id=0,
    )
    results = {}
    for batch in args.batches:
        prompts = peer_common.prompts_for(batch, args.prompt_len, vocab, args.prompts)
        ids = torch.tensor(prompts, dtype=torch.long)
        mask = torch.ones_like(ids)
        torch.manual_seed(batch)
        times = []
        with torch.inference_mode():
            for step in range(args.warmup + args.steps):
                start = time.perf_counter()
                generated = model.generate(ids, attention_mask=mask, **sampling)
                elapsed = time.perf_counter() - start
                if generated.shape[1] - ids.shape[1] != args.new_tokens:
                    raise RuntimeError(f"generated {generated.shape[1] - ids.shape[1]} tokens, not {args.new_tokens}")
                if step >= args.warmup:
                    times.append(elapsed)
        median = peer_common.median(times)
        results[str(batch)] = {
            "tokens_per_s": batch * args.new_tokens / median,
            "median_seconds": median,
            "step_seconds": times,
        }
        peer_common.log(f"batch {batch}: {results[str(batch)]}")
    out.emit({
        "batches": results,
        "prompt_len": len(prompts[0]),
        "new_tokens": args.new_tokens,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "blas": peer_common.torch_blas(torch),
        "versions": peer_common.versions(torch, transformers),
    })


if __name__ == "__main__":
    main()
