#!/bin/bash
# code at 033dee1 (clean); .gpu/syncs.py was provenance/syncs_v1.py then
# Session 2026-11-26b, call 1: gpu-check whole (doctor, sweep, loop) and host syncs per update
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
el gpu-check
timeout 400 python3 -m localsgd gpu-check --out $OUT/gpu --sweep-minutes 1.5 --loop-minutes 4 2>&1 | grep -v Warning | tail -40
el syncs
timeout 90 python3 .gpu/syncs.py $OUT/syncs.jsonl bat_H8:1:0.1:8 seq_H8:0:0.1:8 2>&1 | grep -v Warning | tail -6
el done
