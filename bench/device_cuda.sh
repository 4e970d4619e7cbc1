#!/usr/bin/env bash
# The CUDA checks on a GPU machine, in one run: versions, the sgl_kernel names SGLang imports there, replays per
# second through SGLang's decode runner with real CUDA graphs, and the campaign (gate profile) on --device cuda.
#
# For a machine with no package registry (an image with python3, torch, pytest, but not SGLang): put the wheels of
# SGLang and of what its targeted modules import (requirements/sglang-0.5.23.txt, requirements/harness.txt, for
# that machine's Python) in .whl/; they are installed into /tmp/site first. With SGLang installed, none are needed.
#
# Usage: OUT=DIR [SUITES="suites/test_decode_capture.py ..."] bench/device_cuda.sh
#        (everything, log included, lands in DIR, default reports/device; SUITES default: all of suites/)
set -uo pipefail
OUT=${OUT:-reports/device}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

step() { echo; echo "== $1 ($(date +%T))"; }
step versions
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'EOF'
import importlib.metadata as m, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "|",
      torch.cuda.get_device_name(0), "|", " ".join(f"{p} {m.version(p)}" for p in ("sglang", "hypothesis", "pytest")))
EOF

step "campaign, gate profile, --device cuda"
started=$(date +%s)
# shellcheck disable=SC2086 - SUITES is a list of paths
timeout "${CAMPAIGN_TIMEOUT:-300}" python3 -m harness campaign --device cuda --report-dir /tmp/device-campaign \
  --suites ${SUITES:-suites}
echo "campaign exit $? in $(( $(date +%s) - started )) s"

step "replays per second, real CUDA graphs"
timeout 150 python3 bench/bench_decode.py --device cuda --skip-mutants --replays 2000
cp /tmp/device-campaign/summary.md "$OUT/" 2>/dev/null
tar czf "$OUT/campaign.tgz" -C /tmp device-campaign 2>/dev/null
exit 0
