#!/usr/bin/env bash
# call 1: wheels, data, the project copied to /tmp/w, the scripts to /tmp/scripts, mpnet part 1
set -u
T0=$(date +%s)
mkdir -p /tmp/site /tmp/data /tmp/mp /tmp/scripts /tmp/res /tmp/tth/models
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpuA/whl/*.whl 2>&1 | tail -2
tar -xzf .gpuA/data.tgz -C /tmp/data
cp .gpuA/mp.part* .gpuA/mp.sha256 /tmp/mp/; cp .gpuA/*.sh .gpuA/*.py /tmp/scripts/
rm -rf /tmp/w; mkdir -p /tmp/w; tar --exclude='./.gpu*' --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C /tmp/w
source /tmp/scripts/env.sh
python3 -c "import faiss, fastapi, bm25s, pytrec_eval, torch, transformers, sentence_transformers as s, tokenizers; print('deps ok', torch.__version__, transformers.__version__, s.__version__, tokenizers.__version__, torch.cuda.get_device_name())"
nproc; ls /tmp/data/scifact; du -sh /tmp/w; echo "setup $(( $(date +%s) - T0 ))s"
