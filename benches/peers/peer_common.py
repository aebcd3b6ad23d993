"""What every peer script shares: the thread limit, the versions and backend it reports, the
median of its timed steps, and a stdout that carries nothing but its one JSON object.

Standard library only, and nothing here imports numpy or torch: a script calls
`limit_threads()` first, before importing them, so that OpenMP, MKL and OpenBLAS read the
limit from the environment when they load.

The contract every peer keeps (the Rust side, `benches/src/`, keeps the same on rein's side):
- `--threads N` (default 2): torch's intra-op threads, one inter-op thread, and
  `OMP_NUM_THREADS` / `MKL_NUM_THREADS` / `OPENBLAS_NUM_THREADS` set before numpy or torch
  load; llama.cpp gets `n_threads = n_threads_batch = N`.
- `--steps N --warmup W`: W untimed steps, then N timed ones; the figure is their true median
  (`statistics.median`: the mean of the two middle values for an even count), and every
  timed value is reported too.
- The one JSON object the script prints on stdout carries `versions` (python and every
  package it used, keyed by import name), `threads`, and, where torch runs, `blas`.
- Everything else (library warnings, progress bars, per-seed lines) goes to stderr.
"""

import json
import os
import platform
import statistics
import sys

DEFAULT_THREADS = 2

# The environment variables the BLAS / OpenMP runtimes (and HF tokenizers' Rust thread pool)
# read when they load.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "RAYON_NUM_THREADS",
)


def threads_from_argv(argv=None):
    """The value of `--threads N` / `--threads=N` in `argv` (default: sys.argv), or the default
    when it is absent or not a positive integer (argparse reports a bad value later)."""
    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--threads="):
            value = arg.split("=", 1)[1]
        else:
            continue
        try:
            n = int(value)
        except ValueError:
            continue
        if n >= 1:
            return n
    return DEFAULT_THREADS


def limit_threads(n=None):
    """Sets the thread variables to `n` (default: `--threads` from sys.argv); to be called
    before numpy or torch is imported. Returns `n`."""
    n = threads_from_argv() if n is None else n
    loaded = [m for m in ("numpy", "torch") if m in sys.modules]
    if loaded:
        log(f"warning: {', '.join(loaded)} already imported: thread variables may be ignored")
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if n == 1 else "true")
    return n


def add_threads_argument(parser):
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="CPU threads (torch intra-op, OpenMP/MKL/OpenBLAS, llama.cpp); default 2",
    )


def add_step_arguments(parser, steps, warmup=1, what="steps"):
    parser.add_argument("--steps", type=int, default=steps, help=f"timed {what} (default {steps})")
    parser.add_argument(
        "--warmup", type=int, default=warmup, help=f"untimed {what} before them (default {warmup})"
    )


def add_generation_arguments(parser, model_help, what):
    """What both generation peers take: the model, the batch sizes, the prompts and lengths, the
    timed and untimed runs, the threads."""
    parser.add_argument("model", help=model_help)
    parser.add_argument("batches", type=int, nargs="+")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompts", help="JSON {batch: [[ids]]} (default: random ids)")
    add_step_arguments(parser, steps=5, what=what)
    add_threads_argument(parser)


def configure_torch(torch, threads):
    """torch's intra-op threads to `threads`, its inter-op pool to one thread."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError as e:  # only allowed before any inter-op work started
        log(f"torch.set_num_interop_threads(1) refused: {e}")


def torch_blas(torch):
    """A short description of torch's CPU backend: BLAS / LAPACK, MKL, oneDNN, the ATen CPU
    capability in use, e.g. `BLAS_INFO=mkl, LAPACK_INFO=mkl, MKL 2024.2, oneDNN v3.13.3, CPU
    capability AVX2`."""
    parts = []
    try:
        shown = torch.__config__.show()
    except Exception as e:  # noqa: BLE001 (a description, never fatal)
        shown = ""
        parts.append(f"torch.__config__.show() failed: {e}")
    for line in shown.splitlines():
        line = line.strip(" -")
        if line.startswith("Build settings:"):
            for setting in line[len("Build settings:"):].split(","):
                setting = setting.strip()
                if setting.startswith(("BLAS_INFO=", "LAPACK_INFO=")):
                    parts.append(setting)
    for line in shown.splitlines():
        line = line.strip(" -")
        if "Math Kernel Library Version" in line:
            parts.append("MKL " + line.split("Version", 1)[1].split()[0].split("-")[0])
        elif "MKL-DNN" in line or "oneDNN" in line:
            version = [w for w in line.split() if w.startswith("v") and w[1:2].isdigit()]
            parts.append("oneDNN " + (version[0] if version else "?"))
        elif line.startswith("OpenMP"):
            parts.append(line.split("(")[0].strip())
    try:
        parts.append("CPU capability " + str(torch.backends.cpu.get_cpu_capability()))
    except Exception:  # noqa: BLE001
        pass
    return ", ".join(parts)


# Import name -> distribution name, where they differ.
DISTRIBUTIONS = {
    "llama_cpp": "llama-cpp-python",
    "stable_baselines3": "stable-baselines3",
    "rein_sandbox": "rein-sandbox",
    "math_verify": "math-verify",
}


def versions(*modules):
    """{"python": ..., <import name>: <version>} for each module (a module or its name)."""
    found = {"python": platform.python_version()}
    for module in modules:
        name = module if isinstance(module, str) else module.__name__
        version = None
        if not isinstance(module, str):
            version = getattr(module, "__version__", None)
        if version is None:
            try:
                from importlib import metadata

                version = metadata.version(DISTRIBUTIONS.get(name, name))
            except Exception:  # noqa: BLE001
                version = "?"
        found[name] = str(version)
    return found


def median(values):
    """The true median (mean of the two middle values for an even count); None when empty."""
    return statistics.median(values) if values else None


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Stdout:
    """Keeps the real stdout for the one JSON object and points file descriptor 1 (and
    `sys.stdout`) at stderr meanwhile, so that what libraries print, from Python or from C,
    lands in the log and not in the JSON."""

    def __init__(self):
        sys.stdout.flush()
        self._saved = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def emit(self, obj):
        """Writes `obj` as one line of JSON to the real stdout."""
        sys.stderr.flush()
        with os.fdopen(os.dup(self._saved), "w", encoding="utf-8") as out:
            out.write(json.dumps(obj) + "\n")
            out.flush()


def prompts_for(batch, prompt_len, vocab, path=None):
    """`batch` prompts of token ids: from `path` (a JSON object {"<batch>": [[id, ...], ...]},
    as the Rust side writes the ids it generated from) when given, else `prompt_len` random ids
    in [3, min(vocab, 512)) from a generator seeded with `batch` (the same ids in every peer
    that takes them from here)."""
    if path is not None:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        rows = table.get(str(batch))
        if rows is None or len(rows) != batch:
            raise ValueError(f"{path}: no {batch} prompts under the key \"{batch}\"")
        return [[int(t) for t in row] for row in rows]
    import random

    rng = random.Random(batch)
    high = min(vocab, 512)
    return [[rng.randrange(3, high) for _ in range(prompt_len)] for _ in range(batch)]


def trainer_step_timer():
    """A transformers `TrainerCallback` that times each optimiser step, from `on_step_begin` to
    `on_step_end`; the seconds are in its `times`. (transformers is imported here, not at the
    top, so that peers without it can use this module.)"""
    import time

    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.last = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.last)

    return StepTimes()


def trainer_step_result(trainer, timer, args, torch):
    """What every TRL peer reports of its run, from its `trainer_step_timer`: the true median of
    the steps after `args.warmup` untimed ones, each step's seconds, the process's peak resident
    set (Linux reports KiB), whether gradient checkpointing was asked for and took effect, the
    threads and the BLAS."""
    import resource

    timed = timer.times[args.warmup :]
    return {
        "seconds_per_step": median(timed),
        "step_seconds": timed,
        "warmup_seconds": timer.times[: args.warmup],
        "steps": len(timed),
        "warmup": args.warmup,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "gradient_checkpointing": args.gradient_checkpointing,
        "checkpointing_active": checkpointing_active(trainer),
        "threads": args.threads,
        "blas": torch_blas(torch),
    }


def checkpointing_settings(config_class, on):
    """The TRL config keys that turn gradient checkpointing `on` or off. transformers 5.x renamed
    the argument (the old name is a deprecated alias) and TRL's default (True) is set on the old
    one, so both are set where both exist."""
    import dataclasses

    settings = {"gradient_checkpointing": on}
    if "activation_checkpointing" in {f.name for f in dataclasses.fields(config_class)}:
        settings["activation_checkpointing"] = on
    return settings


def checkpointing_active(trainer):
    """Whether the trained model checkpointed its activations: the flag's effect, not the flag
    (Trainer enables it in train())."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    active = getattr(unwrapped, "is_activation_checkpointing", None)
    if active is None:
        active = getattr(unwrapped, "is_gradient_checkpointing", None)
    return active


def trl_schedule(lr, steps):
    """The TRL config keys both TRL peers share: rein's optimiser and schedule (AdamW at `lr`,
    constant, eps 1e-8, no weight decay, gradient clipping at 1.0) for `steps` steps, float32 on
    the CPU, seed 1, prompts in file order, logging every step, nothing saved or reported."""
    return dict(
        learning_rate=lr,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=1,
        shuffle_dataset=False,
        disable_tqdm=True,
    )
