#!/bin/bash
# Session 2026-11-27 (seventh GPU session), call 18, commit 380cee0 (clean) plus .gpu/call18_table01.py:
# Table 1's converged file, all 3 seeds, through the results cache on cuda (seed by seed; the
# cache returned as one tar, rewritten after each seed)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
END=$((SECONDS + 545)); mkdir -p /tmp/lcache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/lcache/nvidia_smi.csv
for s in 0 1 2; do
  timeout $((END - SECONDS)) python3 .gpu/call18_table01.py $s 2>&1 | grep -v -i warn | cut -c1-300
  tar czf $OUT/call18.tgz -C /tmp/lcache .
done
