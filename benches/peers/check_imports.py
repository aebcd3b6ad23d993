"""Checks the benchmark peers without their heavy packages: run with plain `python3` (no torch,
no venv), from anywhere:

    python3 benches/peers/check_imports.py [SCRIPT.py ...]     (default: every peer script)

Every peer script (benches/peers/*.py but this one) is imported as a module, not run: torch,
transformers, trl, peft, datasets, accelerate, stable_baselines3, gymnasium, numpy and
llama_cpp, with all their submodules, are replaced by permissive stubs (a `sys.meta_path`
finder placed first, so the stubs are used even where the real packages are installed), so
that `import X`, `from X.y import Z`, subclassing `Z` and calling `X.f(...)` at import time all
work. Each script must guard its `main()` with `if __name__ == "__main__":` and must leave the
thread variables alone on import.

What touches rein's own files is exercised for real, with nothing stubbed:
- python_reward.py is run as the bench runs it (`python3 python_reward.py GROUPS.jsonl`) on a
  few groups, and its stand-in bindings and the plugin app (plugins/math-answer-py/app.py)
  are imported and scored in-process: the stand-ins come from the WIT file, so an app or a
  stand-in that disagrees with crates/rein-plugin/wit/ fails here;
- cleanrl_ppo.py's `hyperparameters()` resolves recipes/ppo-cartpole.toml and its fragments;
- peer_common's argv parsing, median and prompt generation.

Exits 1, naming each failing script and its error, if any check fails; prints one line per
script and a closing `N passed, N failed` line.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import traceback
import types

HERE = pathlib.Path(__file__).resolve().parent
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "datasets",
    "accelerate",
    "stable_baselines3",
    "gymnasium",
    "numpy",
    "llama_cpp",
)


# --- Stubs ---------------------------------------------------------------------------------


class _StubMeta(type):
    """The type of stub classes: any attribute is another stub class; calling a pure stub
    class gives a stub instance (a class a script derives from one constructs normally)."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_is_stub"):
            return _StubInstance()
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _StubBase(metaclass=_StubMeta):
    _is_stub = False


def _stub_class(name):
    return _StubMeta(name.rsplit(".", 1)[-1], (_StubBase,), {"_is_stub": True, "__qualname__": name})


class _StubInstance:
    """A value that takes any attribute, call, index, operator or iteration."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubInstance()

    def __call__(self, *args, **kwargs):
        return _StubInstance()

    def __getitem__(self, item):
        return _StubInstance()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __float__(self):
        return 0.0

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def _op(self, *args):
        return _StubInstance()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _op
    __truediv__ = __rtruediv__ = __pow__ = __neg__ = __matmul__ = _op


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name == "__version__":
            return "0+stub"
        return _stub_class(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every module under the HEAVY packages, and makes each a stub package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in HEAVY:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0+stub"
        return module

    def exec_module(self, module):
        pass


def install_stubs():
    for name in list(sys.modules):
        if name.split(".", 1)[0] in HEAVY:
            del sys.modules[name]
    sys.meta_path.insert(0, _StubFinder())


# --- Checks --------------------------------------------------------------------------------

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def import_script(path):
    """Imports `path` as a module named `peer_<stem>` (never `__main__`)."""
    name = "peer_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    before = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    argv = sys.argv
    sys.argv = [str(path), "--threads", "7"]  # an import must not act on it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    after = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    if before != after:
        raise AssertionError(f"importing it changed the thread variables: {before} -> {after}")
    return module


def check_guard(path, module):
    source = path.read_text(encoding="utf-8")
    if 'if __name__ == "__main__":' not in source and "if __name__ == '__main__':" not in source:
        raise AssertionError('no `if __name__ == "__main__":` guard')
    if not callable(getattr(module, "main", None)):
        raise AssertionError("no main()")


GROUPS = [
    {"completions": ["<answer>42</answer>", "so \\boxed{41}", "#### 42", "no answer"], "reference": "42"},
    {"completions": ["x = 1/2, \\boxed{0.5}", "<answer> 3 </answer>"], "reference": "\\boxed{\\frac{1}{2}}"},
]


def check_python_reward(path, module):
    """Runs the script as the bench does (stdlib Python, a groups file), then scores in-process
    through the stand-ins and the real plugin app."""
    with tempfile.TemporaryDirectory() as tmp:
        groups = pathlib.Path(tmp) / "groups.jsonl"
        groups.write_text("".join(json.dumps(g) + "\n" for g in GROUPS), encoding="utf-8")
        run = subprocess.run(
            [sys.executable, str(path), str(groups)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise AssertionError(f"`python3 {path.name} GROUPS.jsonl` exited {run.returncode}: {last}")
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise AssertionError(f"expected one JSON line on stdout, got {len(lines)}: {run.stdout!r}")
    result = json.loads(lines[0])
    if not result.get("completions_per_s", 0) > 0:
        raise AssertionError(f"no completions_per_s in {result}")
    # In-process: the stand-ins (built from the WIT file) and the app itself.
    if hasattr(module, "load_app"):
        app = module.load_app()
        reward = module.reward_function(app)
        scores = [reward(g["completions"], g["reference"]) for g in GROUPS]
        if scores != [[1.0, 0.0, 1.0, 0.0], [1.0, 0.0]]:
            raise AssertionError(f"math-answer scored {scores}")
        from wit_world.exports.reward_api import Group

        api = app.RewardApi()
        metadata = api.metadata()
        if metadata.name != "math-answer-py" or not metadata.config_keys:
            raise AssertionError(f"metadata {metadata}")
        api.init("{}")
        scored = api.score([Group(prompt="p", completions=["<answer>7</answer>"], reference="7", metadata="", tokens=[], images=[])])
        if scored[0][0].score != 1.0 or [c.name for c in scored[0][0].components] != ["correct", "answered"]:
            raise AssertionError(f"RewardApi.score gave {scored}")


def check_cleanrl_ppo(path, module):
    hp = module.hyperparameters()
    if hp["num_updates"] != -(-hp["total_steps"] // (hp["num_envs"] * hp["num_steps"])):
        raise AssertionError(f"num_updates {hp['num_updates']} is not rein's div_ceil")
    for key in ("lr", "gamma", "gae_lambda", "update_epochs", "num_minibatches", "stop_at_return", "return_window"):
        if hp.get(key) is None:
            raise AssertionError(f"recipe gave no {key}: {hp}")


def check_peer_common(path, module):
    assert module.threads_from_argv(["x", "--threads", "3"]) == 3
    assert module.threads_from_argv(["--threads=5"]) == 5
    assert module.threads_from_argv(["--threads", "zero"]) == module.DEFAULT_THREADS
    assert module.threads_from_argv([]) == module.DEFAULT_THREADS
    assert module.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert module.median([3.0, 1.0, 2.0]) == 2.0
    a = module.prompts_for(4, 16, 49152)
    assert a == module.prompts_for(4, 16, 49152) and len(a) == 4 and all(len(r) == 16 for r in a)
    assert all(3 <= t < 512 for r in a for t in r)


CHECKS = {
    "python_reward.py": check_python_reward,
    "cleanrl_ppo.py": check_cleanrl_ppo,
    "peer_common.py": check_peer_common,
}


def main(argv):
    scripts = [pathlib.Path(a).resolve() for a in argv] or sorted(
        p for p in HERE.glob("*.py") if p.name != pathlib.Path(__file__).name
    )
    install_stubs()
    sys.path.insert(0, str(HERE))
    passed, failed = 0, []
    for path in scripts:
        try:
            module = import_script(path)
            if path.name != "peer_common.py":
                check_guard(path, module)
            check = CHECKS.get(path.name)
            if check is not None:
                check(path, module)
        except BaseException as e:  # noqa: BLE001 (SystemExit from a script counts too)
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"FAILED {path}: {detail}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            failed.append(path.name)
            continue
        print(f"ok {path.relative_to(HERE.parents[1]) if HERE.parents[1] in path.parents else path}")
        passed += 1
    print(f"{passed} passed, {len(failed)} failed")
    if failed:
        print(f"check_imports: failing peer scripts: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
