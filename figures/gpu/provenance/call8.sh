#!/bin/bash
# code at 5ab3acd (clean; .gpu/ is git-ignored)
# Session 2026-11-26b, call 4 (8 in figures/gpu numbering): doctor with the hand-written reference on
# cuda; gpu-check's loop with its untimed warm-up (sweep skipped)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 190 python3 -m localsgd gpu-check --out $OUT/gpu --skip sweep --loop-minutes 2 2>&1 | grep -v Warning | tail -16
