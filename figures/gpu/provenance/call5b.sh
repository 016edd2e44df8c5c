# call 5b (2026-11-26, second session), on the still-warm machine of call 5, code at 033dee1
# (call5.sh ran .gpu/syncs.py = provenance/syncs_v1.py; its 0.1-epoch runs were too short)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LOCALSGD_DATA=$PWD/.gpu/data LOCALSGD_CACHE=/tmp/lcache
timeout 150 python3 .gpu/syncs.py $OUT/syncs2.jsonl bat_H8:1:1:8 seq_H8:0:1:8 bat_H1:1:1:1
