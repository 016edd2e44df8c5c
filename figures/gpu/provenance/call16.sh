#!/bin/bash
# Session 2026-11-27 (sixth GPU session), call 16, commit 02c1e7c (clean) plus .gpu/call16_probe.py:
# gpu-check's doctor and loop at HEAD, then probes of Table 1's and Figure 7's converged files
# (seed 0, then seed 1 while time lasts); everything returned as one tar, rewritten after each step
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
END=$((SECONDS + 520)); mkdir -p /tmp/o; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/o/nvidia_smi.csv
timeout 100 python3 -m localsgd gpu-check --out /tmp/o/gpu --skip sweep --loop-minutes 1.0 2>&1 | grep -v Warning | tail -4
tar czf $OUT/call16.tgz -C /tmp/o .
for s in 0 1; do
  timeout $((END - SECONDS)) python3 .gpu/call16_probe.py /tmp/o/conv_s$s $s table01,fig07 2>&1 | grep -v -i warn | cut -c1-260
  tar czf $OUT/call16.tgz -C /tmp/o .
done
