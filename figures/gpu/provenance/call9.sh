#!/bin/bash
# code at 102b3e5 (clean) plus the git-ignored .gpu/packed.py (provenance/packed.py)
# Session 2026-11-26c, call 1 (9 in figures/gpu numbering): gpu-check whole on this GPU, then the
# packed-replicas probe (.gpu/packed.py: grouped-conv ResNet-20 stack vs vmap vs one model, eager and compiled)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $OUT/nvidia_smi.csv
timeout 230 python3 -m localsgd gpu-check --out $OUT/gpu --loop-minutes 2 2>&1 | grep -v Warning | tail -40
timeout 250 python3 .gpu/packed.py gpu $OUT/packed.json 2>&1 | grep -v Warning | tail -30
