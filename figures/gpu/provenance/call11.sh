#!/bin/bash
# code at 9c9a116 (clean)
# Session 2026-11-26c, call 3 (11 in figures/gpu numbering): Table 3's first paper configuration, 300 epochs
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout -s INT 285 python3 .gpu/table03_cell.py $OUT/table03 2>&1 | grep -v -i warn | tail -30
