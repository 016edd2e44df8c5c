#!/bin/bash
# code as call 6 + PhaseClock's query() before waiting; .gpu/ab_sync.py = provenance/host_read_ab.py, .gpu/syncs.py = provenance/syncs.py
# Session 2026-11-26b, call 3: paired A/B of the host read per update; syncs per record after query()
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
el ab
timeout 150 python3 .gpu/ab_sync.py $OUT/ab_sync.json 2>&1 | grep '^{'
el syncs
timeout 60 python3 .gpu/syncs.py $OUT/syncs_final.jsonl bat_H8:1:2:8:2 sgp_like_seq_H1:0:1:1:1 2>&1 | grep '^{'
el done
