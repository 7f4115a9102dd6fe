#!/usr/bin/env bash
# call 6: wait for the detached run, send its results back, then mpnet-base `fit` on SciFact
set -u
source /tmp/scripts/env.sh
for i in $(seq 1 90); do [ -f /tmp/res/.done ] && break; sleep 5; done
cat /tmp/res/timeline.txt; tail -4 /tmp/res/gpu_tests.txt; grep "'system'" /tmp/res/gpu_bench.log | cut -c1-600
cp /tmp/res/gpu.json /tmp/res/gpu.md /tmp/res/gpu_tests.txt $OUT/ 2>/dev/null
tar -czf $OUT/res.tgz -C /tmp res
cd /tmp/mp && cat mp.part1 mp.part2 mp.part3 mp.part4 mp.part5 > all.tgz && echo "$(cat mp.sha256)  all.tgz" | sha256sum -c && tar -xzf all.tgz -C /tmp/tth/models/ || { echo "mpnet parts incomplete"; ls -la /tmp/mp; exit 3; }
python3 /tmp/scripts/restore.py /tmp/tth/models/mpnet-base/model.safetensors
cd /tmp/w; T0=$(date +%s)
timeout 420 python3 benchmarks/fit_scifact.py --no-reranker --fit-args "--model mpnet-base" --work /tmp/fitmp --name fit_scifact_mpnet_gpu > /tmp/res/fit_mpnet.log 2>&1; echo "rc=$? after $(( $(date +%s) - T0 ))s" >> /tmp/res/fit_mpnet.log
cp benchmarks/results/fit_scifact_mpnet_gpu.* $OUT/ 2>/dev/null; find /tmp/fitmp -name fit.json -exec cp {} $OUT/fit_mpnet_stages.json \; ; cp /tmp/res/fit_mpnet.log $OUT/; tail -25 /tmp/res/fit_mpnet.log
