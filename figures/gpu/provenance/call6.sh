#!/bin/bash
# code at 033dee1 + this session's host-read change (uncommitted then, without the query() fix and the loop warm-up); .gpu/syncs.py = provenance/syncs.py, .gpu/phases.py = provenance/phases.py
# Session 2026-11-26b, call 2: after the change to one host read per record
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
el syncs
timeout 100 python3 .gpu/syncs.py $OUT/syncs_after.jsonl bat_H8:1:2:8:2 seq_H8:0:2:8:2 bat_H1:1:2:1:2 sgp_like_seq_H1:0:1:1:1 2>&1 | grep -v Warning | grep '^{' 
el phases
timeout 100 python3 .gpu/phases.py $OUT/phases_after.jsonl bat_tf32_H1:1:tf32:4:1:contiguous seq_tf32_H8_nhwc:0:tf32:2:8:channels_last bat_tf32_H8:1:tf32:4:8:contiguous 2>&1 | grep '^{'
el gpu-check
timeout 260 python3 -m localsgd gpu-check --out $OUT/gpu --skip doctor --sweep-minutes 1.2 --loop-minutes 2.2 2>&1 | grep -v Warning | tail -36
el done
