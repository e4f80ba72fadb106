#!/usr/bin/env bash
# The whole deep suite once on this GPU machine, through the real CLI, with its figures.
#
#   bench/gpu_deep_suite.sh [BUDGET_S] [OUT_DIR]     (defaults: 90, docs/evidence)
#
# Needs PyTorch with CUDA, numpy and nvidia-ml-py; runs from the repository root with the
# package installed (pip install --no-deps -e .) or with PYTHONPATH=src. Prints TFLOP/s per
# dtype, memory, host-link and peer bandwidth per GPU, the NVML telemetry under load and the
# total time; keeps the JSON report and the GPU's identity under OUT_DIR.
set -uo pipefail
budget="${1:-90}"
out="${2:-docs/evidence}"
mkdir -p "$out"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
report="$out/deep_suite_${stamp}.json"
python="${PYTHON:-python3}"

nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total \
  --format=csv >"$out/deep_suite_${stamp}_gpus.csv" 2>&1 || true
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' \
  >"$out/deep_suite_${stamp}_versions.txt" 2>&1 || true

started=$(date +%s.%N)
"$python" -m gpuguard.cli check --deep --json --budget "$budget" >"$report"
status=$?
ended=$(date +%s.%N)

"$python" - "$report" "$status" "$started" "$ended" <<'PY'
import json
import sys

path, status, started, ended = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
report = json.load(open(path))
print(f"gpuguard check --deep: status {report['status']} (exit {status}); report {path}")
for check in report["checks"]:
    if check["check"].startswith("deep-"):
        print(f"  {check['check']}: {check['outcome']} in {check['duration_s']:.1f} s {check['detail']}")
for layer in report["layers"].values():
    for f in layer["findings"]:
        if f["code"].startswith("DEEP_") or f["severity"] != "info":
            print(f"  [{f['severity']}] {f['code']}: {f['message']}")
            if f["evidence"]:
                print(f"      {f['evidence']}")
print(f"total wall time (CLI start to end, incl. PyTorch import): {ended - started:.1f} s")
PY
