#!/bin/bash
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
R=$OUT/runs; mkdir -p $R
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > $OUT/env2.txt
el torchrun nccl 1 rank
timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m localsgd.runner --config cifar10_resnet20 --device cuda --nodes 1 --procs-per-node 1 --epochs 1 --no-progress --out $R/runner_nccl1 > $R/runner.log 2>&1; echo "runner rc $?"; grep -v "^\[rank" $R/runner.log | tail -6
el phases
timeout 120 python3 .gpu/phases.py $OUT/phases.jsonl bat_tf32_H8:1:tf32:4:8 seq_tf32_H8:0:tf32:4:8 bat_fp32_H1:1:fp32:2:1 2>&1 | tail -8
el probe
PROBE_SKIP=replica_nhwc timeout 170 python3 .gpu/probe.py $OUT/probe2.csv 150 2>&1 | tee $R/probe.log | tail -24
el bench
timeout 60 python3 -m localsgd bench replicas --device cuda --world 16 --batch 128 --steps 3 --rounds 3 --warmup 1 --json > $OUT/bench_replicas.json 2> $R/bench.err; echo "bench rc $?"; cat $OUT/bench_replicas.json
el done
tar czf $OUT/runs2.tar.gz -C $OUT runs && rm -rf $R
