#!/usr/bin/env bash
# calls 3-5: one more mpnet part; what the detached run has so far comes back
cp .gpu?/mp.part* /tmp/mp/ 2>/dev/null; ls -la /tmp/mp | tail -6
cat /tmp/res/timeline.txt 2>/dev/null; grep "'system'" /tmp/res/gpu_bench.log 2>/dev/null | cut -c1-400
tar -czf $OUT/res_partial.tgz -C /tmp res 2>/dev/null; true
