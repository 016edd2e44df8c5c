#!/bin/bash
# One-off GPU check for the first lent GPU (session 2026-11-26). Every step bounded; goes on after failures.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
R=$OUT/runs; mkdir -p $R
t0=$(date +%s); el() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
el env
{ date -u; nvidia-smi; nvidia-smi -q | grep -iE "product name|clocks|power limit|driver|cuda" | head -30; git log -1 --format='%H %s' 2>/dev/null;
  python3 -c "import torch,torchvision,sys,platform;print('python',sys.version.split()[0],'torch',torch.__version__,'torchvision',torchvision.__version__,'cuda',torch.version.cuda,'cudnn',torch.backends.cudnn.version(),'nccl',torch.cuda.nccl.version(),'gpu',torch.cuda.get_device_name(0),'sm',torch.cuda.get_device_properties(0).multi_processor_count,'cpu',platform.processor())"; nproc; } > $OUT/env.txt 2>&1
cat $OUT/env.txt | tail -3
el doctor
timeout 90 python3 -m localsgd doctor --json > $OUT/doctor.json 2> $R/doctor.err; echo "doctor rc $?"
timeout 60 python3 -m localsgd doctor > $R/doctor.txt 2>&1; tail -8 $R/doctor.txt
el bench replicas
timeout 90 python3 -m localsgd bench replicas --device cuda --world 16 --batch 128 --steps 3 --rounds 3 --warmup 1 --layouts --json > $OUT/bench_replicas.json 2> $R/bench.err; echo "bench rc $?"; cat $OUT/bench_replicas.json
el probe
timeout 200 python3 .gpu/probe.py $OUT/probe.csv 165 2>&1 | tee $R/probe.log | tail -30
el train replicas
for v in "seq_fp32 --batched false --precision fp32" "seq_tf32 --batched false --precision tf32" "bat_tf32 --batched true --precision tf32" "bat_bf16 --batched true --precision bf16"; do
  set -- $v; name=$1; shift
  /usr/bin/time -f "$name wall %e s" timeout 90 python3 -m localsgd train --engine replicas --config cifar10_resnet20 --device cuda --world-size 16 --local-steps 8 --epochs 2 --no-progress --out $R/train_$name "$@" > $R/train_$name.log 2>&1; echo "$name rc $?"; tail -3 $R/train_$name.log
done
el torchrun nccl 1 rank
timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m localsgd.runner --config cifar10_resnet20 --device cuda --nodes 1 --procs-per-node 1 --epochs 1 --no-progress --out $R/runner_nccl1 > $R/runner.log 2>&1; echo "runner rc $?"; tail -6 $R/runner.log
el done
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv >> $OUT/env.txt
tar czf $OUT/runs.tar.gz -C $OUT runs && rm -rf $R
