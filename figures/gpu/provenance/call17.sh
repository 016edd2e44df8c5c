#!/bin/bash
# Session 2026-11-27 (sixth GPU session), call 17, commit 02c1e7c plus .gpu/call16_probe.py: Figure 7's
# converged file at K = 8 and 16 (H = 1, 8; seed 0) with a 5-epoch warm-up instead of its 1 epoch
# (call 16: K = 16 at lr 1.6 after 24 warm-up updates stalled near 20 %)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache WARMUP=5
mkdir -p /tmp/o
timeout 140 python3 .gpu/call16_probe.py /tmp/o/conv_w5 0 fig07 2>&1 | grep -v -i warn | cut -c1-260
tar czf $OUT/call17.tgz -C /tmp/o .
