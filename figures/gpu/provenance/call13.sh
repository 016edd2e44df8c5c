#!/bin/bash
# code at 5d29d38 (clean) plus .gpu/table01_gpu.py
# Session 2026-11-26d, call 2 (13 in figures/gpu numbering): Table 1's four configurations at the
# converged proxy's scale (B_glob = 2048), seed 0, on the GPU (exploratory: one seed)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 330 python3 .gpu/table01_gpu.py $OUT/t01 2>&1 | grep -v -i warn | tail -8
