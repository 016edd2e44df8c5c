#!/bin/bash
# code at 9c9a116 (clean; the machine's provenance.json reads 102b3e5 dirty: its .git copy was stale)
# Session 2026-11-26c, call 2 (10 in figures/gpu numbering): gpu-check whole with the packed engine
# (sweep rows packed_k16_b128; the loop packs by default on CUDA), then host reads per update and per
# record of train() with the merged record read (packed, vmap, sequential; K=16, H=8, 1 epoch)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 270 python3 -m localsgd gpu-check --out $OUT/gpu --loop-minutes 2 2>&1 | grep -v Warning | tail -45
timeout 150 python3 .gpu/syncs.py $OUT/syncs.jsonl packed:p:1:8:2 vmap:1:1:8:2 sequential:0:1:8:2 2>&1 | grep -v -i warn | tail -8
