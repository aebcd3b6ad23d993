#!/usr/bin/env bash
# rein's GPU check, one command on a machine with an NVIDIA GPU, its driver, CUDA's NVRTC and
# headers, and Python with PyTorch and transformers (no Rust, no network needed). Written by
# `cargo xtask gpu-bundle`.
#
#   bash run.sh               # prints one table, writes results.json; then counts every kernel
#                             # launch of generation and of a GRPO step (cubecl's profiler)
#   bash run.sh --no-profile  # without the launch counts
#
# Exit status 0 only if every parity row holds; speed rows are figures, never gates.
set -uo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"

if ! { nvidia-smi -L 2>/dev/null | grep -q '^GPU' || ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; then
  echo "no CUDA device found: nothing was checked"
  exit 2
fi

# The binaries travel compressed (xz); unpack them, with Python's lzma where xz is missing.
for packed in rein-gpu-check.xz rein.xz; do
  [ -e "$packed" ] || continue
  xz -d -k -f "$packed" 2>/dev/null ||
    "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$packed"
  chmod +x "${packed%.xz}"
done

# NVRTC and the CUDA headers the kernels are compiled against, and cuBLAS the products run on: a
# CUDA toolkit if there is one, else the ones PyTorch's wheels bring (site-packages/nvidia/*/).
site=$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
if [ -z "${CUDA_PATH:-}" ]; then
  for candidate in /usr/local/cuda /opt/cuda "$site"/nvidia/cu13 "$site"/nvidia/cuda_runtime; do
    if [ -e "$candidate/include/cuda_fp16.h" ]; then export CUDA_PATH="$candidate"; break; fi
  done
fi
for lib in "${CUDA_PATH:-/usr/local/cuda}"/lib64 "${CUDA_PATH:-/usr/local/cuda}"/targets/x86_64-linux/lib "$site"/nvidia/*/lib; do
  if compgen -G "$lib/libnvrtc.so*" >/dev/null || compgen -G "$lib/libcublas.so*" >/dev/null; then
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvidia-smi | grep -o 'CUDA Version: [0-9.]*' || true
echo "CUDA_PATH=${CUDA_PATH:-(none)}"
echo "NVRTC: $(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d"/libnvrtc.so.* 2>/dev/null; done | head -1)"
echo "cuBLAS: $(./rein-gpu-check --cublas) ($(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d"/libcublas.so.* 2>/dev/null; done | head -1))"
"$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "CUDA", torch.version.cuda, "| transformers", transformers.__version__)'

# The device memory a command used at its peak: nvidia-smi's reading every 100 ms while it runs
# (both sides measured alike, CUDA context included), written to $1 for summary.py.
sample_memory() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$1" 2>/dev/null &
  sampler=$!
}
stop_sampling() { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; }

echo "== the speed checkpoint (random SmolLM2-135M-shaped Llama, seed 0)"
"$PYTHON" gpu_torch.py --create speed-model --prompts prompts.json || echo "could not write the speed checkpoint"

echo "== rein on CUDA"
speed=()
if [ -e speed-model/config.json ]; then speed=(--speed-model speed-model --prompts prompts.json); fi
sample_memory rein-memory.txt
RUST_BACKTRACE=1 timeout "${REIN_TIMEOUT:-200}" ./rein-gpu-check --device cuda --probe --fixtures fixtures \
  "${speed[@]}" --out rein.json > rein.log 2>&1
status=$?
stop_sampling
tail -n 60 rein.log
if [ "$status" -eq 124 ]; then echo "rein-gpu-check ran past ${REIN_TIMEOUT:-200} s"; fi

if [ -x ./rein ] && [ -e recipes/ppo-cartpole.toml ]; then
  echo "== PPO on CartPole on CUDA (rein run)"
  start=$SECONDS
  timeout "${PPO_TIMEOUT:-90}" ./rein run recipes/ppo-cartpole.toml --plugin-dir plugins \
    --set 'device="cuda"' --set 'train.runs_dir="runs"' > ppo.log 2>&1
  ppo=$?
  echo "{\"status\": $ppo, \"seconds\": $((SECONDS - start))}" > ppo.json
  tail -n 5 ppo.log
fi

echo "== PyTorch peers"
if [ -e speed-model/config.json ]; then
  sample_memory peers-memory.txt
  timeout "${PEER_TIMEOUT:-120}" "$PYTHON" gpu_torch.py --bench speed-model --prompts prompts.json --out peers.json \
    > peers.log 2>&1 || echo "the peers did not finish (peers.log)"
  stop_sampling
  tail -n 20 peers.log
fi

echo "== the large checkpoint (random Qwen2.5-0.5B-shaped Qwen2, seed 0): products decide"
"$PYTHON" gpu_torch.py --create large-model --shape qwen2.5-0.5b --prompts large-prompts.json ||
  echo "could not write the large checkpoint"
if [ -e large-model/config.json ]; then
  # bf16 products both sides: generation at batch 256, one GRPO step of 8 × (64 + 512) tokens.
  sample_memory rein-large-memory.txt
  timeout "${LARGE_TIMEOUT:-200}" ./rein-gpu-check --device cuda --no-parity --fixtures fixtures \
    --speed-model large-model --prompts large-prompts.json --speed-rows generation-bf16,step-bf16 \
    --batches 256 --new-tokens 128 --step-rows 8 --step-tokens 512 --out rein-large.json > rein-large.log 2>&1
  # Exit status 1 is expected: without parity rows nothing is claimed to hold.
  if [ $? -eq 124 ]; then echo "rein-gpu-check on the large checkpoint ran past ${LARGE_TIMEOUT:-200} s"; fi
  stop_sampling
  grep -E '^(speed|error)' rein-large.log
  sample_memory peers-large-memory.txt
  timeout "${PEER_TIMEOUT:-200}" "$PYTHON" gpu_torch.py --bench large-model --prompts large-prompts.json \
    --batches 256 --new-tokens 128 --generate-dtypes bf16 --step-rows 8 --step-tokens 512 --step-dtypes bf16 \
    --no-matmul --out peers-large.json > peers-large.log 2>&1 || echo "the large peers did not finish (peers-large.log)"
  stop_sampling
  tail -n 5 peers-large.log
fi

"$PYTHON" summary.py rein.json peers.json ppo.json results.json --large rein-large.json peers-large.json
summary=$?

# Kernel profiles, one rein-gpu-check per part so each log is that part's alone: cubecl's
# profiling logger (a `cubecl.toml` here) waits for and logs every launch. profile.py adds the
# launches per generated token and per GRPO step, and µs per launch, to results.json.
if [ "${1:-}" != "--no-profile" ] && [ -e speed-model/config.json ]; then
  for part in "generation --batches 1,64 --new-tokens 32" "step --step-rows 8 --new-tokens 128"; do
    name=${part%% *}
    printf '[profiling.logger]\nlevel = "basic"\nfile = "profile-%s.log"\nappend = false\n' "$name" > cubecl.toml
    # shellcheck disable=SC2086 # the part's words are arguments
    timeout "${PROFILE_TIMEOUT:-150}" ./rein-gpu-check --device cuda --no-parity --fixtures fixtures \
      --speed-model speed-model --prompts prompts.json --speed-rows $part --out "profile-$name.json" \
      > "profile-$name.out" 2>&1
    # Exit status 1 is expected: without parity rows nothing is claimed to hold.
    if [ $? -eq 124 ]; then echo "the $name profile ran past ${PROFILE_TIMEOUT:-150} s"; fi
    rm -f cubecl.toml
    grep -E '^speed' "profile-$name.out"
    sleep 2  # cubecl's logger writes from a task of its own
    "$PYTHON" profile.py "profile-$name.log" "$name" "profile-$name.json" results.json
  done
fi
if [ "$status" -ne 0 ] || [ "$summary" -ne 0 ]; then exit 1; fi
