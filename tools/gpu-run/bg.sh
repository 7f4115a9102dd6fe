#!/usr/bin/env bash
# detached on the GPU machine: benchmarks/gpu.py (encode, train), then pytest -m gpu; results in /tmp/res
set -u
source /tmp/scripts/env.sh
R=/tmp/res; mkdir -p $R; cd /tmp/w
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $R/timeline.txt; }
el start
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import torch,transformers,sentence_transformers as s,tokenizers;print(torch.__version__,transformers.__version__,s.__version__,tokenizers.__version__,torch.cuda.get_device_name())"; } > $R/gpu_info.txt 2>&1
timeout 330 python3 benchmarks/gpu.py --parts encode,train > $R/gpu_bench.log 2>&1; echo "rc=$?" >> $R/gpu_bench.log
cp benchmarks/results/gpu.json benchmarks/results/gpu.md $R/ 2>/dev/null
el "bench done"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "rc=$?" >> $R/gpu_tests.txt
el "pytest done"
touch $R/.done
