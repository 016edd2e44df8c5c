#!/bin/bash
# Third call: the two fixes (aligned replica stack; float BatchNorm input under autocast in the batched engine)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
el probe
PROBE_ONLY="tf32/nchw/single_b2048 tf32/nhwc/single_b2048 bf16/nhwc/single_b2048 tf32/nhwc/replica_k16_b128 fp32/nhwc/replica_k16_b128 tf32/nchw/batched_k16_b128 tf32/nhwc/batched_k16_b128 bf16/nchw/batched_k16_b128 bf16/nhwc/batched_k16_b128" timeout 120 python3 .gpu/probe.py $OUT/probe3.csv 100 2>&1 | tail -12
el phases
timeout 100 python3 .gpu/phases.py $OUT/phases3.jsonl bat_bf16_H8:1:bf16:4:8:contiguous bat_tf32_H8_nhwc:1:tf32:4:8:channels_last seq_tf32_H8_nhwc:0:tf32:2:8:channels_last bat_tf32_H1:1:tf32:4:1:contiguous 2>&1 | grep -v Warning | tail -6
el bench layouts
timeout 45 python3 -m localsgd bench replicas --device cuda --world 16 --batch 128 --steps 3 --rounds 3 --warmup 1 --layouts --json > $OUT/bench_replicas3.json 2>$OUT/bench3.err; echo "bench rc $?"; cat $OUT/bench_replicas3.json; tail -2 $OUT/bench3.err
el done
