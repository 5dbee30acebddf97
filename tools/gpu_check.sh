#!/usr/bin/env bash
# The one prepared run on the GPU machine (docs/cuda.md): install the carried opstrata wheels, run the cuda
# tests and the cuda benchmarks, and write their results to $OUT (or ./gpu_results).
#
# Here, before the run:   bash tools/gpu_check.sh --wheels     (builds .whl/; ignored by git)
# There (device tool):    bash tools/gpu_check.sh              (with `carry: [".whl"]`, timeout ~600 s)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--wheels" ]; then
    rm -rf .whl && mkdir -p .whl
    for p in ops graph runtime comm quant eval; do python -m pip wheel -q --no-deps -w .whl "packages/$p" || exit 1; done
    python -m pip download -q --no-deps -d .whl tomlkit || exit 1   # eval's one dependency the GPU image lacks
    ls -la .whl; exit 0
fi
out="${OUT:-gpu_results}"
mkdir -p "$out"
site=/tmp/opstrata_site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl \
    || { echo "gpu_check: no wheels in .whl/ (run 'bash tools/gpu_check.sh --wheels' first)"; exit 2; }
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$out/machine.txt" 2>&1
python3 -c "import opstrata.ops as o; from opstrata.ops._cuda import cuda_status as s; print(s().summary(), '| opstrata-ops', o.__version__)" >> "$out/machine.txt" 2>&1
cat "$out/machine.txt"
rc=0
( cd packages/ops && timeout 150 python3 -m pytest tests/cuda tests/test_device_memory.py tests/test_capture.py tests/test_device_allocations.py \
    -q -p no:cacheprovider -x --maxfail=20 --junitxml="$out/ops_cuda_tests.xml" -rfE ) > "$out/ops_cuda_tests.txt" 2>&1 || rc=1
tail -25 "$out/ops_cuda_tests.txt"
( cd packages/runtime && timeout 90 python3 -m pytest tests/cuda tests/test_device_session.py tests/test_device_graph.py tests/test_device_arena.py -q -p no:cacheprovider -rfE \
    --junitxml="$out/runtime_cuda_tests.xml" ) > "$out/runtime_cuda_tests.txt" 2>&1 || rc=1
tail -15 "$out/runtime_cuda_tests.txt"
timeout 80 python3 packages/ops/benchmarks/bench_cuda.py --json "$out/bench_cuda.json" > "$out/bench_cuda.txt" 2>&1 || rc=1
cat "$out/bench_cuda.txt"
timeout 120 python3 packages/eval/benchmarks/bench_cuda_zoo.py --rounds 3 --json "$out/bench_cuda_zoo.json" > "$out/bench_cuda_zoo.txt" 2>&1 || rc=1
tail -30 "$out/bench_cuda_zoo.txt"
cuda_ops=$(python3 -c "import opstrata.ops as o; print(','.join(o.list_ops(device='cuda')))")
timeout 60 python3 -m opstrata.eval conformance ops --device cuda --ops "$cuda_ops" --dtypes float32,float16,bfloat16 \
    --out "$out/repro" > "$out/conformance_cuda.txt" 2>&1 || rc=1
tail -12 "$out/conformance_cuda.txt"
timeout 60 python3 -m opstrata.eval demo --device cuda --out /tmp/opstrata_demo --progress plain > "$out/demo_cuda.txt" 2>&1 || rc=1
grep -E "nodes on cuda|cuda session vs cpu|checks passed|FAIL" "$out/demo_cuda.txt"
timeout 45 python3 packages/eval/benchmarks/bench_device_session.py --device cuda --models gpt2 --exporters torchscript \
    --rounds 5 --arena-models resnet18,gpt2,bert > "$out/bench_device_session.txt" 2>&1 || rc=1
cat "$out/bench_device_session.txt"
echo "gpu_check: exit $rc (results in $out)"
exit $rc
