#!/bin/bash
# Session 2026-11-27 (seventh GPU session), calls 18b and 18c on the same warm machine, commit 380cee0
# plus .gpu/call18_table01.py. Call 18's tar held the extracted data cache too (177 MB) and did not
# come back; 18b returned the results cache alone (its training command failed: .gpu not carried),
# 18c (carry .gpu) finished seed 2's three remaining runs -- mini-batch SGD w/o tricks resumed from
# its per-epoch checkpoint at update 60 of 244, where call 18's time limit had cut it.
# 18b:
tar czf $OUT/call18_results.tgz -C /tmp/lcache results runs.json nvidia_smi.csv
# 18c:
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 160 python3 .gpu/call18_table01.py 2 2>&1 | grep -v -i warn | cut -c1-300
cp /tmp/lcache/runs.json /tmp/lcache/runs_seed2.json
tar czf $OUT/call18b_results.tgz -C /tmp/lcache results runs_seed2.json
