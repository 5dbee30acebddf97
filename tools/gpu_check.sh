#!/usr/bin/env bash
# The one prepared run on the GPU machine (docs/cuda.md): install the carried opstrata-ops wheel, run the
# cuda tests and the cuda benchmark, and write their results to $OUT (or ./gpu_results).
#
# Here, before the run:   python -m pip wheel --no-deps -w .whl packages/ops   (.whl ignored by git)
# There (device tool):    bash tools/gpu_check.sh            (with `carry: [".whl"]`)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_results}"
mkdir -p "$out"
site=/tmp/opstrata_site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/opstrata_ops-*.whl \
    || { echo "gpu_check: no .whl/opstrata_ops-*.whl to install (build it first, see the header)"; exit 2; }
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$out/machine.txt" 2>&1
python3 - >> "$out/machine.txt" 2>&1 <<'PY'
import opstrata.ops as ops
from opstrata.ops._cuda import cuda_status
print(cuda_status().summary(), "| opstrata-ops", ops.__version__)
PY
cat "$out/machine.txt"
cd packages/ops
timeout 420 python3 -m pytest tests/cuda tests/test_cuda_kernels_host.py tests/test_device_memory.py -q -p no:cacheprovider \
    -o addopts="" --junitxml="$out/cuda_tests.xml" -rfE 2>&1 | tee "$out/cuda_tests.txt" | tail -40
tests_rc=${PIPESTATUS[0]}
cd ../..
timeout 240 python3 packages/ops/benchmarks/bench_cuda.py --json "$out/bench_cuda.json" 2>&1 | tee "$out/bench_cuda.txt"
bench_rc=${PIPESTATUS[0]}
echo "gpu_check: tests exit $tests_rc, bench exit $bench_rc (results in $out)"
exit $(( tests_rc != 0 || bench_rc != 0 ))
