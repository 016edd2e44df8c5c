#!/bin/bash
# Session 2026-11-27, call 14: gpu-check's doctor and loop on the current code (engines changed since
# call 12), then the converged probes of .gpu/converged_probe.py
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/nvidia_smi.csv
git log -1 --format=%H > $OUT/commit.txt; git status --short >> $OUT/commit.txt
timeout 130 python3 -m localsgd gpu-check --out $OUT/gpu --skip sweep --loop-minutes 1.2 2>&1 | grep -v Warning | tail -20
timeout 420 python3 .gpu/converged_probe.py $OUT/conv 2>&1 | grep -v -i warn | tail -12
ls -R $OUT | head -30
