set -x
cd /tmp/rec
date
.venv/bin/python -m bench.board --record > /tmp/recA.log 2>&1
date
for v in "" "--kv-bits 4" "--lm-head int8"; do
  n=$(echo "$v" | tr -d ' -'); .venv/bin/python -m sw.deploy --config vector --max-new-tokens 8 $v --out /tmp/d_$n > /tmp/d_$n.log 2>&1
done
date
.venv/bin/python -m bench.beats --model smollm2 --out /tmp/beats_smol.json > /tmp/beats_smol.log 2>&1
.venv/bin/python -m bench.beats --out /tmp/beats_ref.json > /tmp/beats_ref.log 2>&1
date
.venv/bin/python -m bench.scaling --config vector --systems DDR4-class --record > /tmp/recB.log 2>&1
date
.venv/bin/python -m bench.scaling --config vector --systems default --steps decode-2048 --kv-bits 4 --record > /tmp/recC.log 2>&1
date
