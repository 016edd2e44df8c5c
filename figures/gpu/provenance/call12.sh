#!/bin/bash
# code at 5d29d38 (clean) plus .gpu/converged_gpu.py
# Session 2026-11-26d, call 1 (12 in figures/gpu numbering): gpu-check whole after the library split
# (data package, replicas/replica_stack/replica_base/batched, runner split), then the converged proxy
# of Table 5 / Figure 6 (H = 1 and 8, seed 0) on the GPU beside the CPU runs of figures/converged
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/nvidia_smi.csv
timeout 230 python3 -m localsgd gpu-check --out $OUT/gpu --loop-minutes 1.5 --sweep-minutes 1.5 2>&1 | grep -v Warning | tail -30
timeout 250 python3 .gpu/converged_gpu.py $OUT/conv 1,8 0 2>&1 | grep -v -i warn | tail -8
ls -R $OUT | head -30
