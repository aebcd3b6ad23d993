"""llama.cpp (through llama-cpp-python's bindings) decoding throughput on this machine, for
`cargo xtask bench generate`: new tokens per second at each batch size, from the same `.gguf`
file rein decodes (SmolLM2-135M-Instruct, Q4_1).

llama.cpp's own batched decoding, as its `examples/batched` does it, through the low-level C
API for every batch size (batch 1 included, where it is the `simple` example's loop): one
context whose KV cache holds `n_seq_max = BATCH` sequences (n_ctx = BATCH x PROMPT_LEN +
NEW_TOKENS, rounded up to 256 per sequence; llama.cpp's other context defaults kept, flash
attention `auto` among them), one sequence id per row; the prompts of all rows go through one
`llama_decode`, then each step samples every row's next token (one sampler chain per row) and
decodes all rows' tokens in one `llama_batch`. Settings as rein's side
(benches/src/generate.rs): PROMPT_LEN-token prompts (the ids from `--prompts`, else the same
random ids as hf_generate.py: [3, min(vocab, 512)) seeded by the batch size), exactly
NEW_TOKENS new tokens per row (end-of-generation tokens do not stop a row, as rein ignores
them), pure sampling at temperature 1 (the chain is `dist` alone: no top-k, top-p or min-p),
`n_threads = n_threads_batch = --threads`.

A step is one whole generation (prefill, then NEW_TOKENS samples and NEW_TOKENS - 1 decodes)
for the batch, the KV cache cleared before it; `--warmup` untimed steps, then `--steps` timed
ones; tokens/s = batch * NEW_TOKENS / the true median step time.

Usage: llama_cpp_generate.py MODEL.gguf BATCH [BATCH ...] [--prompt-len 16]
       [--new-tokens 128] [--steps 5] [--warmup 1] [--prompts PROMPTS.json] [--threads 2]
PROMPTS.json: {"<batch>": [[token id, ...], ...], ...}.
Prints one JSON object: {"batches": {"<batch>": {"tokens_per_s", "median_seconds",
"step_seconds", "prefill_seconds", "n_ctx"}, ...}, "prompt_len", "new_tokens", "warmup",
"steps", "threads", "model", "llama_cpp_system_info", "versions"}.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peer_common  # noqa: E402

if __name__ == "__main__":
    peer_common.limit_threads()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import time  # noqa: E402

import llama_cpp  # noqa: E402


class Model:
    """A GGUF model loaded on the CPU."""

    def __init__(self, path):
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.ptr, desc, len(desc))
        self.description = desc.value.decode(errors="replace")

    def close(self):
        llama_cpp.llama_model_free(self.ptr)


class Batched:
    """A context for `rows` sequences of up to `prompt_len + new_tokens` tokens, with one
    sampler chain per row and a `llama_batch` large enough for all prompts at once."""

    def __init__(self, model, rows, prompt_len, new_tokens, threads, seed=1):
        self.model, self.rows = model, rows
        per_seq = -(-(prompt_len + new_tokens) // 256) * 256
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = rows * per_seq
        params.n_batch = max(rows * prompt_len, rows)
        params.n_ubatch = min(params.n_batch, 512)
        params.n_seq_max = rows
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        self.n_ctx = params.n_ctx
        self.ctx = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp cannot make a context for {rows} sequences")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self.seed = seed
        self.samplers = []

    def _new_samplers(self):
        for sampler in self.samplers:
            llama_cpp.llama_sampler_free(sampler)
        self.samplers = []
        for row in range(self.rows):
            chain_params = llama_cpp.llama_sampler_chain_default_params()
            chain_params.no_perf = True
            chain = llama_cpp.llama_sampler_chain_init(chain_params)
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(self.seed + row))
            self.samplers.append(chain)

    def _fill(self, entries):
        """Puts (token, position, sequence, wants logits) entries into the batch."""
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(entries)

    def _decode(self):
        code = llama_cpp.llama_decode(self.ctx, self.batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def generate(self, prompts, new_tokens):
        """Generates `new_tokens` tokens for every prompt; returns (tokens per row, prefill
        seconds)."""
        llama_cpp.llama_memory_clear(self.memory, True)
        self._new_samplers()
        start = time.perf_counter()
        entries, index = [], []
        for row, prompt in enumerate(prompts):
            for pos, token in enumerate(prompt):
                entries.append((token, pos, row, pos == len(prompt) - 1))
            index.append(len(entries) - 1)
        self._fill(entries)
        self._decode()
        prefill = time.perf_counter() - start
        out = [[] for _ in prompts]
        for k in range(new_tokens):
            entries = []
            for row, prompt in enumerate(prompts):
                token = llama_cpp.llama_sampler_sample(self.samplers[row], self.ctx, index[row])
                out[row].append(token)
                entries.append((token, len(prompt) + k, row, True))
            if k == new_tokens - 1:
                break
            index = list(range(len(prompts)))
            self._fill(entries)
            self._decode()
        return out, prefill

    def close(self):
        for sampler in self.samplers:
            llama_cpp.llama_sampler_free(sampler)
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    peer_common.add_generation_arguments(parser, "the .gguf file", what="generations")
    args = parser.parse_args()
    out = peer_common.Stdout()
    llama_cpp.llama_backend_init()
    model = Model(args.model)
    peer_common.log(f"llama.cpp: {model.description}, vocab {model.n_vocab}")
    results = {}
    for batch in args.batches:
        prompts = peer_common.prompts_for(batch, args.prompt_len, model.n_vocab, args.prompts)
        ctx = Batched(model, batch, len(prompts[0]), args.new_tokens, args.threads)
        times, prefills = [], []
        try:
            for step in range(args.warmup + args.steps):
                start = time.perf_counter()
                generated, prefill = ctx.generate(prompts, args.new_tokens)
                elapsed = time.perf_counter() - start
                if any(len(row) != args.new_tokens for row in generated):
                    raise RuntimeError("a row did not get every new token")
                if step >= args.warmup:
                    times.append(elapsed)
                    prefills.append(prefill)
        finally:
            ctx.close()
        median = peer_common.median(times)
        results[str(batch)] = {
            "tokens_per_s": batch * args.new_tokens / median,
            "median_seconds": median,
            "step_seconds": times,
            "prefill_seconds": peer_common.median(prefills),
            "n_ctx": ctx.n_ctx,
        }
        peer_common.log(f"batch {batch}: {results[str(batch)]}")
    model.close()
    out.emit({
        "batches": results,
        "prompt_len": len(prompts[0]),
        "new_tokens": args.new_tokens,
        "warmup": args.warmup,
        "steps": args.steps,
        "threads": args.threads,
        "model": model.description,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "versions": peer_common.versions(llama_cpp),
    })


if __name__ == "__main__":
    main()
