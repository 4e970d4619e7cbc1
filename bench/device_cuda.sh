#!/usr/bin/env bash
# The nightly hardware run on an NVIDIA GPU, in one go (tox -e nightly-cuda runs exactly this):
#   1. versions; 2. every suite on --device cuda (real CUDA graphs; PROFILE=gate|nightly), report with the HTML
#   page in $OUT/campaign; 3. replays per second and capture seconds through SGLang's decode runner; 4. the capture
#   suites' mutant self-tests on the GPU (known bug 2 and the prefill mutants on cuda, bug 1's static scan; bug 1's
#   NPU-personality check runs on the virtual device, the only place the NPU runner runs), with the seconds each
#   took to be detected.
#
# For a machine with no package registry (an image with python3, torch, pytest, but not SGLang): put the wheels of
# SGLang and of what its targeted modules import (requirements/sglang-0.5.23.txt, requirements/harness.txt, for
# that machine's Python) in .whl/; they are installed into /tmp/site first. With SGLang installed, none are needed.
#
# Usage: OUT=DIR [PROFILE=gate|nightly] [HARNESS_PYTHON=python] [SUITES="suites/..."] bench/device_cuda.sh
#        (everything, log included, lands in DIR, default reports/device; SUITES default: all of suites/)
set -uo pipefail
OUT=${OUT:-reports/device}
PY=${HARNESS_PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/log.txt") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
status=0

step() { echo; echo "== $1 ($(date +%T))"; }
step versions
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" - <<'PYEOF'
import importlib.metadata as m, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "|",
      torch.cuda.get_device_name(0), "|", " ".join(f"{p} {m.version(p)}" for p in ("sglang", "hypothesis", "pytest")))
PYEOF

step "every suite, profile ${PROFILE:-gate}, --device cuda"
started=$(date +%s)
# shellcheck disable=SC2086 - SUITES is a list of paths
timeout "${CAMPAIGN_TIMEOUT:-900}" "$PY" -m harness campaign --device cuda --profile "${PROFILE:-gate}" \
  --report-dir "$OUT/campaign" --suites ${SUITES:-suites} || status=1
echo "campaign in $(( $(date +%s) - started )) s; examples per suite in $OUT/campaign/summary.md"

step "replays per second and capture seconds, real CUDA graphs"
timeout 300 "$PY" bench/bench_decode.py --device cuda --skip-mutants --replays 2000 || status=1

step "mutant self-tests of the capture suites on the GPU (seconds per mutant: durations below)"
HARNESS_SELFTEST_DEVICE=cuda timeout "${MUTANTS_TIMEOUT:-1500}" "$PY" -m pytest -p no:cacheprovider -q \
  tests/test_prefill_mutants.py tests/test_decode_mutants.py --durations=0 --report-dir "$OUT/selftest" || status=1
echo "device run exit $status; report: $OUT/campaign/report.html"
exit $status
