"""HF transformers generation throughput on this machine, for `cargo xtask bench generate`.

usage: hf_generate.py CHECKPOINT_DIR PROMPT_LEN NEW_TOKENS RUNS BATCH [BATCH ...]
Prints JSON: {"<batch>": tokens_per_second, ...} (new tokens only, sampling, 2 threads, the
fastest of RUNS runs).
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)
path, prompt_len, new_tokens, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
vocab = model.config.vocab_size
results = {}
for batch in map(int, sys.argv[5:]):
    torch.manual_seed(0)
    ids = torch.randint(3, min(vocab, 512), (batch, prompt_len))
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm up
        elapsed = float("inf")
        for _ in range(runs):  # the fastest of the runs, as rein's figure
            start = time.perf_counter()
            model.generate(ids, **kwargs)
            elapsed = min(elapsed, time.perf_counter() - start)
    results[str(batch)] = batch * new_tokens / elapsed
print(json.dumps(results))
