#!/bin/bash
# Session 2026-11-27, call 15 (same warm machine as call 14): gpu-check's doctor and loop again (call
# 14's files did not come back: over the 8-file limit), then Table 3's 2x2 probe for seeds 1 and 2
# and SlowMo's for seeds 1 and 2 while time lasts; everything returned as one tar
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
mkdir -p /tmp/o
timeout 100 python3 -m localsgd gpu-check --out /tmp/o/gpu --skip sweep --loop-minutes 1.0 2>&1 | grep -v Warning | tail -3
tar czf $OUT/call15.tgz -C /tmp/o .
timeout 300 python3 .gpu/converged_probe.py /tmp/o/conv 1,2 table03,slowmo 2>&1 | grep -v -i warn | grep -o "'variant.*\|'topology.*\|failed.*" | cut -c1-200
tar czf $OUT/call15.tgz -C /tmp/o .
