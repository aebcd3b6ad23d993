"""PyTorch and transformers on the GPU, beside `rein-gpu-check` in the GPU bundle's `run.sh`.

`--create DIR --prompts FILE [--shape S]` writes a speed checkpoint both sides time, randomly
initialised (seed 0, f32 safetensors), and 256 prompts of random tokens:
- `smollm2-135m` (the default): a Llama of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads
  with 3 KV heads, vocab 49152, tied embeddings), prompts of 16 tokens;
- `qwen2.5-0.5b`: a Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads with 2 KV
  heads, q/k/v biases, vocab 151936, tied embeddings), prompts of 64 tokens: the size where
  products, not launches, decide.

`--bench DIR --prompts FILE --out peers.json` times, on the same checkpoint and prompts:
transformers `generate` (greedy, exactly `--new-tokens` per sequence, sdpa attention) in each of
`--generate-dtypes` at each batch size; one GRPO step of `--step-rows` rows with `--step-tokens`
completion tokens in each of `--step-dtypes`, written as TRL computes it (per-token
log-probabilities from one forward pass, the clipped ratio loss averaged per sequence then over
the batch, backward, gradient clipping to 1.0, AdamW), gradient checkpointing off, the weights
f32 (bf16: mixed precision under `torch.autocast`, as rein's `model.dtype = "bf16"`); and,
unless `--no-matmul`, torch's own matmul rate (f32 without TF32, and bf16) as the ceiling.
Each row records the peak GPU memory torch allocated.
"""

import argparse
import json
import time

import torch


SHAPES = {
    "smollm2-135m": ("LlamaConfig", "LlamaForCausalLM", 16, dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2)),
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", 64, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151643)),
}


def create(model_dir, prompts_path, shape, prompts):
    import transformers

    config_class, model_class, prompt_len, fields = SHAPES[shape]
    config = getattr(transformers, config_class)(**fields)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, config.vocab_size, (prompts, prompt_len), generator=g)
    with open(prompts_path, "w") as f:
        json.dump(ids.tolist(), f)


def cuda_time(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def row(rows, check, value, unit, detail):
    rows.append({"check": check, "kind": "speed", "value": value, "unit": unit, "detail": detail})
    print(f"speed  {check:<44} {value:>10.3f} {unit}  {detail}", flush=True)


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def generation(model_dir, prompts, rows, batches, new_tokens, dtype_names):
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda")
    for name in dtype_names:
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").to(device, DTYPES[name])
        model.eval()
        for batch in batches:
            ids = prompts[:batch].to(device)
            mask = torch.ones_like(ids)

            def run(tokens=new_tokens):
                with torch.no_grad():
                    return model.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        max_new_tokens=tokens,
                        min_new_tokens=tokens,
                        do_sample=False,
                        pad_token_id=0,
                    )

            run(4)
            torch.cuda.reset_peak_memory_stats()
            seconds = cuda_time(run, 1)
            peak = torch.cuda.max_memory_allocated() / 2**20
            row(rows, f"transformers generate {name}, batch {batch}", batch * new_tokens / seconds, "tok/s",
                f"{batch * new_tokens} tokens in {seconds:.2f} s, sdpa, greedy; peak {peak:.0f} MiB")
        del model
        torch.cuda.empty_cache()


def grpo_step(model_dir, prompts, rows, step_rows, step_tokens, name):
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").to(device, torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    prompt_len = prompts.shape[1]
    completions = torch.tensor(
        [[(r * 7919 + j * 104729) % vocab for j in range(step_tokens)] for r in range(step_rows)])
    ids = torch.cat([prompts[:step_rows], completions], dim=1).to(device)
    advantages = torch.tensor([1.0 if r % 2 == 0 else -1.0 for r in range(step_rows)], device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=name == "bf16"):
            logits = model(input_ids=ids).logits[:, prompt_len - 1:-1]
        log_prob = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)
        ratio = torch.exp(log_prob - log_prob.detach())
        loss1 = ratio * advantages[:, None]
        loss2 = torch.clamp(ratio, 0.8, 1.2) * advantages[:, None]
        loss = -torch.min(loss1, loss2).mean(dim=1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    step()
    torch.cuda.reset_peak_memory_stats()
    seconds = cuda_time(step, 3)
    peak = torch.cuda.max_memory_allocated() / 2**20
    mode = "f32" if name == "f32" else "bf16 mixed"
    row(rows, f"torch grpo step {mode}, {step_rows} rows × {prompt_len}+{step_tokens}", seconds * 1e3, "ms",
        f"median of 3, eager, no gradient checkpointing{', autocast' if name == 'bf16' else ''}; peak {peak:.0f} MiB")
    del model, optimizer
    torch.cuda.empty_cache()


def matmul(rows):
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, dtype in DTYPES.items():
        for n in [4096, 8192]:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            seconds = cuda_time(lambda: a @ b, 10)
            row(rows, f"torch matmul {name} {n}³", 2 * n**3 / seconds / 1e12, "TFLOP/s",
                f"{seconds * 1e3:.2f} ms per product{', TF32 off' if name == 'f32' else ''}")


def bench(args):
    prompts = torch.tensor(json.load(open(args.prompts)))
    rows = []
    batches = [int(b) for b in args.batches.split(",") if b]
    generation(args.bench, prompts, rows, batches, args.new_tokens, [d for d in args.generate_dtypes.split(",") if d])
    for name in [d for d in args.step_dtypes.split(",") if d]:
        grpo_step(args.bench, prompts, rows, args.step_rows, args.step_tokens or args.new_tokens, name)
    if not args.no_matmul:
        matmul(rows)
    json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows}, open(args.out, "w"), indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--create", metavar="DIR")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--bench", metavar="DIR")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", default="peers.json")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--generate-dtypes", default="f32,bf16")
    parser.add_argument("--step-rows", type=int, default=8)
    parser.add_argument("--step-tokens", type=int, default=0, help="completion tokens of the step (default: --new-tokens)")
    parser.add_argument("--step-dtypes", default="f32,bf16")
    parser.add_argument("--no-matmul", action="store_true")
    args = parser.parse_args()
    if args.create:
        create(args.create, args.prompts, args.shape, 256)
    if args.bench:
        bench(args)


if __name__ == "__main__":
    main()
