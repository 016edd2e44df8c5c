# call 4 (2026-11-26), from the repository root on the GPU machine:
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 225 python3 -m localsgd gpu-check --out $OUT/gpu --sweep-minutes 1.3 --loop-minutes 1.2
