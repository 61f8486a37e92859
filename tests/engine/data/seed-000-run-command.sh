# The "Exact full run command" block of ../shared/seeds/000_210618d2e3152a74.txt (lines 80-169),
# kept verbatim so the profile test runs in any clone.
set -euo pipefail

repo=/home/george/v620-experiments/baseline-git-20260922
runtime=/home/george/v620-experiments/upstream-20260915/v620-vllm-testing
model=/home/george/v620-vllm/models/intel-autoround
branch=codex/v620-baseline-port-20260922
expected=532ed3f930f475e731c82726e079f3374ab5b33f

cd "$repo"
git fetch origin "$branch"
git switch "$branch"
git pull --ff-only origin "$branch"
test "$(git rev-parse HEAD)" = "$expected"
test -z "$(git status --porcelain --untracked-files=no)"

export V620_ENABLE_RESIDENT=1
export V620_ENABLE_SKINNY=1
export V620_HOST=0.0.0.0
export V620_PORT=8080
export PYTHONPATH="$repo"
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_PLE_CPU_OFFLOAD=1
export VLLM_USE_V2_MODEL_RUNNER=1
export VLLM_ROCM_MOE_PREFILL=0
export VLLM_GDN_HIP_PREFILL=0
export VLLM_RDNA_FUSED_SE=1
export VLLM_TUNED_CONFIG_FOLDER="$repo/tuned-moe"
export VLLM_RDNA_MOE_RESIDENT=1
export VLLM_RDNA_MOE_RESIDENT_SKINNY=1
export VLLM_RDNA_DENSE_INT8=0
export VLLM_RDNA_DENSE_INT8_ONLY=0
export VLLM_RDNA_DENSE_GEMV=0
export VLLM_RDNA_AR=1
export VLLM_RDNA_AR_MAX_KB=64
export VLLM_RDNA_AR_BLOCKS=0
export VLLM_RDNA_AR_PACE=0
export HSA_FORCE_FINE_GRAIN_PCIE=1
export HSA_ENABLE_SDMA=0
export OMP_NUM_THREADS=4
export TOKENIZERS_PARALLELISM=false
export PYTHONFAULTHANDLER=1
export VLLM_CAUSAL_CONV1D_RDNA2_FWD=0
export VLLM_CAUSAL_CONV1D_RDNA2_UPDATE=0
export VLLM_ENABLE_STARTUP_PLAN=0
export VLLM_ROCM_USE_AITER=0
export TORCH_BLAS_PREFER_HIPBLASLT=0
export VLLM_CACHE_ROOT="$repo/cache/vllm"
export TRITON_CACHE_DIR="$repo/cache/triton"
export TORCHINDUCTOR_CACHE_DIR="$repo/cache/inductor"
export TORCH_EXTENSIONS_DIR="$repo/cache/extensions"
export PYTORCH_TUNABLEOP_ENABLED=1
export PYTORCH_TUNABLEOP_TUNING=0
export PYTORCH_TUNABLEOP_HIPBLASLT_ENABLED=0
export PYTORCH_TUNABLEOP_FILENAME="$runtime/tunableop/rocblas-c27e2252cc7a/tunableop_results.csv"
export PATH="$runtime/.venv/bin:/opt/rocm/core-10.0/bin:/opt/rocm/core-10.0/llvm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/games:/usr/local/games:/snap/bin:/snap/bin"
export LD_LIBRARY_PATH="$runtime/.venv/lib/python3.12/site-packages/_rocm_sdk_core/lib:$runtime/.venv/lib/python3.12/site-packages/_rocm_sdk_core/lib/host-math/lib:/opt/rocm/core-10.0/lib"

args=(
  -m vllm.entrypoints.openai.api_server
  --model "$model"
  --served-model-name active qwen3.8-flash-next
  --host 0.0.0.0
  --port 8080
  --tensor-parallel-size 4
  --pipeline-parallel-size 1
  --enable-expert-parallel
  --enable-ep-weight-filter
  --dtype float16
  --max-model-len 262144
  --block-size 1024
  --max-num-seqs 4
  --max-num-batched-tokens 4096
  --kv-cache-memory-bytes 4026531840
  --compilation-config '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[3,6,12]}'
  --speculative-config '{"method":"mtp","num_speculative_tokens":2}'
  --enable-auto-tool-choice
  --tool-call-parser qwen3_xml
  --reasoning-parser qwen3
  --default-chat-template-kwargs '{"enable_thinking":false}'
  --limit-mm-per-prompt '{"image":255,"video":32}'
  --mm-processor-kwargs '{"max_pixels":602112}'
  --enable-prefix-caching
  --mamba-cache-mode align
  --kernel-config '{"moe_backend":"triton"}'
)

"$runtime/.venv/bin/python" "$repo/tools/rdna2/check_v620_tuning.py" \
  --rows-template "$PYTORCH_TUNABLEOP_FILENAME" "${args[@]}"
exec "$runtime/.venv/bin/python" "${args[@]}"
