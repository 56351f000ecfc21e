#!/bin/bash
# Issue 16's runs (results/ablation_v2/PLAN.md) on a lent GPU machine, within one hold of it.
# A fresh machine keeps nothing: the corpus travels again, and every run must finish before the
# machine goes back (a 30m checkpoint with its Adam moments is ~0.7 GB, more than a call can
# bring back), so a hold runs only what it can finish.
#
# Here (once per session; data/xl built by `ocpmx data build-corpus --source debian-xl`):
#   python benchmarks/ablation_v2_pack.py data/xl /tmp/xfer --xz  # parts that fit a call beside the tree
# (pack again once the tree has grown: a call counts the tree and the part in 4 KiB blocks; or,
# as in hold 10, move results/ out of the working tree for the transfer calls: no mode reads it)
# Then one device call per part, with `.xfer` (an ignored folder holding that part) carried:
#   bash benchmarks/ablation_v2_device.sh receive
# Then, in the call that brings the last part:
#   ARMS=bf16,mxfp4_wgrad,mxfp4_wgrad_h16 SEEDS=0 PER_GPU=3 bash benchmarks/ablation_v2_device.sh start
# (PLAN=v2-125m for the 125m stage: the same corpus and options, the 125m model)
# and in calls back to back (each returns $OUT/abl.tgz: every run's metrics, config and log,
# no checkpoints; a warm machine goes back after ~30 s without a call, its runs with it, so keep
# a call in flight from the start to the last poll):
#   bash benchmarks/ablation_v2_device.sh poll 560
# Once a bf16 run with kept checkpoints has finished (RUN=bf16/seed2 by default):
#   bash benchmarks/ablation_v2_device.sh analyze
# or, started while that run trains, each checkpoint analyzed as soon as it exists:
#   bash benchmarks/ablation_v2_device.sh mech
# A run that stopped logging (alive, GPU idle): its Python stacks at the end of its log.txt
#   bash benchmarks/ablation_v2_device.sh stacks
# A GPU benchmark on a GPU the batch has left idle (refused on one a run holds):
#   GPU=0 SECTIONS=columns bash benchmarks/ablation_v2_device.sh bench
# Pause, resume or end some runs of the batch (e.g. a 30m run beside a 125m one that would not
# finish inside the hold otherwise; poll prints each run's wall-clock ETA to judge that):
#   SIG=STOP RUNS="mxfp4_all/seed1" bash benchmarks/ablation_v2_device.sh signal
#
# The code: every call sends the working tree, which may hold uncommitted work. With
# CODE_TAR=<a `git archive` of the commit, carried in an ignored folder> a call runs that
# commit's code, extracted once to /tmp/code/<its SHA-256>; processes started then keep it
# whatever later calls send (start and mech use it; the tree's copy serves otherwise).
DATA=${XL_DATA:-/tmp/xl}
ABL=${ABL_OUT:-/tmp/abl${PLAN:+-$PLAN}}  # one folder per plan: a stage never reads another's runs
ABL=${ABL%/}  # as the runs' --out spell it (signal compares them)
export DATA
mkdir -p $DATA $ABL
if [ -n "$CODE_TAR" ]; then
  code_sha=$(sha256sum "$CODE_TAR" | cut -c1-16)
  code=/tmp/code/$code_sha
  if [ ! -d $code/ocpmx ]; then
    mkdir -p $code/ocpmx.tmp && tar xf "$CODE_TAR" -C $code/ocpmx.tmp && mv $code/ocpmx.tmp $code/ocpmx || exit 2
  fi
  export PYTHONPATH=$code
else  # (PKG_LINK_DIR: where the link to this tree goes; the tests point it into their tmp)
  pkg=${PKG_LINK_DIR:-/tmp/p}
  mkdir -p $pkg
  ln -sfn "$PWD" $pkg/ocpmx
  export PYTHONPATH=$pkg
fi
export PYTHONUNBUFFERED=1
echo "code: $PYTHONPATH/ocpmx${CODE_TAR:+ (from $CODE_TAR)}"
ocpmx_pids() {
  # "PID OUT" for every `python3 -m ocpmx.cli WORDS...` process here (OUT: its --out, or "-"),
  # found by its argv, never by a pattern over whole command lines: such a pattern also
  # matches the shell of the device call that names it. (Fourteenth session: `kill -STOP
  # $(pgrep -f ...)` stopped that shell, the call outran its limit, and the machine was replaced
  # with every run on it lost.)
  local c argv i j out hit
  for c in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t argv 2>/dev/null < "$c" || continue
    hit=; out=-
    for ((i = 0; i < ${#argv[@]}; i++)); do
      if [ "${argv[$i]}" = ocpmx.cli ]; then
        hit=1
        for ((j = 1; j <= $#; j++)); do [ "${argv[$((i + j))]}" = "${!j}" ] || hit=; done
      fi
      [ "${argv[$i]}" = --out ] && out=${argv[$((i + 1))]}
    done
    [ -n "$hit" ] && { c=${c#/proc/}; echo "${c%/cmdline} $out"; }
  done
  return 0
}
case "$1" in
  receive)
    # a part holds shards (.json.gz or .json.xz), the tokenizer and MANIFEST.json
    pids=()
    for f in .xfer/*; do
      case $f in
        *.xz) python3 -c "import gzip, lzma, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
with lzma.open(src) as i, open(dst + '.tmp', 'wb') as raw, \
        gzip.GzipFile(filename='', mode='wb', fileobj=raw, mtime=0) as o:  # as write_shard
    shutil.copyfileobj(i, o, 1 << 22)
import os; os.replace(dst + '.tmp', dst)" "$f" "$DATA/$(basename "${f%.xz}").gz" & pids+=($!) ;;
        *) cp "$f" "$DATA/.$(basename "$f").tmp" && mv "$DATA/.$(basename "$f").tmp" "$DATA/$(basename "$f")" || exit 2 ;;
      esac
    done
    for p in "${pids[@]}"; do wait $p || { echo "a conversion failed"; exit 2; }; done
    ls -la $DATA | tail -n +2
    python3 - <<'EOF'
import json, os, pathlib
d = pathlib.Path(os.environ["DATA"])
want = json.loads((d / "PARTS.json").read_text()) if (d / "PARTS.json").exists() else {}
have = [p.name for p in d.glob("c4-*.json.gz")]
print(f"{len(have)} shards here of {len(want.get('shards', []))} in the pack")
EOF
    ;;
  start)
    # checks every shard against the pack's list (names and SHA-256 of the text; a later start
    # in the same hold trusts that check while PARTS.json and every shard file (inode, size,
    # mtime, ctime) are unchanged: ~17 s saved per batch), tokenizes (all cores), then starts the runs in a new
    # process session: they outlive this call.
    # GPUS=0,1: the GPUs its runs take (default: every visible one), PER_GPU runs on each;
    # START_WAIT_S: seconds to wait before showing the driver's log (default 20)
    : "${ARMS:?ARMS=arm,arm (and SEEDS, PER_GPU)}"
    python3 - <<'EOF' || exit 2
import gzip, hashlib, json, os, pathlib, sys
d = pathlib.Path(os.environ["DATA"])
parts = (d / "PARTS.json").read_text()
want = json.loads(parts)
# what the last full check saw: PARTS.json's text and each shard's file (inode, size, mtime
# and ctime: a rewrite changes the ctime, which no tool can set back), listed and absent ones
def stat(p):
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
names = sorted(set(want["shards"]) | {p.name for p in d.glob("c4-*.json.gz")})
seen = {"parts": hashlib.sha256(parts.encode()).hexdigest(),
        "files": {n: stat(d / n) for n in names}}
mark = d / ".shards_checked.json"
try:
    before = json.loads(mark.read_text())
except (OSError, ValueError):  # none yet, or unreadable: check
    before = None
if before == seen:
    print(f"all {len(want['shards'])} shards present and intact (checked earlier; "
          "PARTS.json and every shard file unchanged since)")
    sys.exit(0)
mark.unlink(missing_ok=True)
bad = []
for name, sha in want["shards"].items():
    p = d / name
    if not p.exists():
        bad.append(f"{name}: missing")
        continue
    h = hashlib.sha256(gzip.open(p).read()).hexdigest()
    if h != sha:
        bad.append(f"{name}: text SHA-256 {h[:12]} != {sha[:12]}")
extra = sorted(set(names) - set(want["shards"]))
bad += [f"{n}: not in the pack" for n in extra]
print("\n".join(bad) or f"all {len(want['shards'])} shards present and intact")
if not bad:
    tmp = mark.with_suffix(".tmp")
    tmp.write_text(json.dumps(seen))
    os.replace(tmp, mark)
sys.exit(1 if bad else 0)
EOF
    t0=$SECONDS
    # --reuse-cache: a second start in the same hold (another ABL_OUT, another PLAN) keeps the
    # token cache that matches the shards here and the tokenizer
    python3 -m ocpmx.cli data tokenize --reuse-cache --out $DATA > $ABL/tokenize.log 2>&1 || { tail $ABL/tokenize.log; exit 3; }
    echo "tokenized in $((SECONDS - t0)) s"; tail -n 3 $ABL/tokenize.log
    { nvidia-smi; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; if [ -n "$CODE_TAR" ]; then echo "commit ${OCPMX_COMMIT:-unknown}: its git archive (SHA-256 $code_sha...), run from $PYTHONPATH"; else echo "commit ${OCPMX_COMMIT:-unknown}: the working tree sent from it"; fi; } > $ABL/device.txt 2>&1
    rm -f $ABL/driver.log
    setsid nohup python3 -m ocpmx.cli ablate run --plan ${PLAN:-v2} --out $ABL --data $DATA \
      --arms "$ARMS" --seeds "${SEEDS:-0}" --per-gpu "${PER_GPU:-1}" ${GPUS:+--gpus $GPUS} \
      > $ABL/driver.log 2>&1 < /dev/null &
    echo $! > $ABL/driver.pid
    sleep ${START_WAIT_S:-20}; cat $ABL/driver.log
    ;;
  analyze)
    # the mechanism analysis (PLAN.md) of a bf16 run trained in this hold with its checkpoints
    # kept (bf16 seed 0 keeps steps 953, 1907 and the last): checkpoints cannot leave the
    # machine, so the analysis runs where they are; mechanism.md / .json land in $ABL
    run=$ABL/${RUN:-bf16/seed2}
    [ -d $run/checkpoints ] || { echo "no checkpoints in $run"; exit 2; }
    setsid nohup python3 -m ocpmx.cli ablate analyze --plan v2 --out $ABL --data $DATA \
      --run $run > $ABL/analyze.log 2>&1 < /dev/null &
    sleep 20; tail -n 5 $ABL/analyze.log
    ;;
  mech)
    # while RUN trains: analyze each kept checkpoint (STEPS, default the plan's 953, 1907 and the
    # last, 3814) as soon as it exists, one at a time, each into $ABL/mech/step<N>. GPU memory,
    # measured in the twelfth session at MICRO=8: ~40 GB for a 30m checkpoint (lagged errors,
    # moments, captured X and dY); two 30m training runs hold ~40 GB more, which left too
    # little (steps 953 and 1907 ran out), so start it when at most one run still trains (list the
    # later checkpoints first: STEPS="3814 1907"). Time: 2.6 min per checkpoint alone, 3.7 min
    # beside one training run
    run=$ABL/${RUN:-bf16/seed2}
    if [ -f $ABL/mech.pid ] && kill -0 "$(cat $ABL/mech.pid)" 2>/dev/null; then
      echo "an analysis is already running (pid $(cat $ABL/mech.pid))"; exit 2
    fi
    cat > $ABL/mech.sh <<EOS
for s in ${STEPS:-953 1907 3814}; do
  ck=$run/checkpoints/\$(printf step_%08d \$s)
  until [ -d \$ck ]; do
    # the batch ended (or never started) without this checkpoint: nothing to wait for
    if ! kill -0 "\$(cat $ABL/driver.pid 2>/dev/null)" 2>/dev/null && [ ! -d \$ck ]; then
      echo "\$(date +%T) checkpoint \$s: the batch is not running and \$ck does not exist"; exit 1
    fi
    sleep ${POLL_S:-10}
  done
  echo "\$(date +%T) checkpoint \$s: analysis starts"
  python3 -m ocpmx.cli ablate analyze --plan v2 --out $ABL/mech/step\$s --data $DATA \\
    --run $run --checkpoints \$s ${MICRO:+--micro-batch $MICRO} > $ABL/mech/step\$s.log 2>&1
  rc=\$?
  echo "\$(date +%T) checkpoint \$s: exit \$rc"
done
EOS
    # MECH_GPU=<id>: the GPU it runs on (on a machine of several GPUs, one the runs leave
    # room on; default: every visible GPU, so torch's first)
    mkdir -p $ABL/mech
    env ${MECH_GPU:+CUDA_VISIBLE_DEVICES=$MECH_GPU} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      setsid nohup bash $ABL/mech.sh > $ABL/mech.log 2>&1 < /dev/null &
    echo $! > $ABL/mech.pid
    sleep 5; cat $ABL/mech.log
    ;;
  stacks)
    # the Python stacks of every training process of this batch ($ABL; ocpmx train prints them
    # on SIGUSR1 and goes on), then the end of each run's log.txt, where they land: for a run
    # that stopped logging
    pids=$(ocpmx_pids train | while read -r pid out; do
      [[ $out == $ABL/* ]] && echo "$pid"; done)
    [ -n "$pids" ] || { echo "no training process in $ABL"; exit 2; }
    for pid in $pids; do kill -USR1 $pid; done
    sleep ${STACKS_WAIT_S:-3}
    for l in $ABL/*/seed*/log.txt; do [ -f "$l" ] && { echo "== $l"; tail -n ${STACKS_LINES:-80} "$l"; }; done
    ;;
  signal)
    # SIG=STOP|CONT|TERM|... RUNS="arm/seedN ..." (or RUNS=all): that signal to those runs of
    # this batch ($ABL), found by ocpmx_pids. STOP pauses a run where it is (its GPU memory
    # stays held), CONT resumes it, TERM ends it (no status.json: the run counts as incomplete).
    # Exit 2 (after signalling the others) when a run named has no training process here.
    : "${SIG:?SIG=STOP|CONT|TERM (and RUNS)}" "${RUNS:?RUNS=\"arm/seedN ...\" or all}"
    SIG=${SIG#SIG}
    kill -l "$SIG" > /dev/null 2>&1 || { echo "SIG=$SIG: not a signal name"; exit 2; }
    procs=$(ocpmx_pids train)
    missing=
    for r in $RUNS; do
      n=0
      while read -r pid out; do
        [ -n "$pid" ] || continue
        if { [ "$r" = all ] && [[ $out == $ABL/*/seed* ]]; } || [ "$out" = "$ABL/$r" ]; then
          kill -s "$SIG" "$pid" && echo "SIG$SIG -> $pid (${out#$ABL/})" && n=$((n + 1))
        fi
      done <<< "$procs"
      [ $n -gt 0 ] || missing="$missing $r"
    done
    [ -z "$missing" ] || { echo "no training process of$missing in $ABL"; exit 2; }
    ;;
  bench)
    # a GPU benchmark (benchmarks/gpu_bench.py --sections ${SECTIONS:-columns}) on GPU $GPU, one
    # that a batch has left idle while its runs on the other GPUs go on (hold 8's GPU 0 idled
    # ~5 minutes): its report to $OUT/bench_<sections>/bench.md / .json (written after each
    # section), BENCH_S seconds at most.
    # Refused while a training process of this machine has that GPU (or every GPU: no
    # CUDA_VISIBLE_DEVICES): its timings would be shared. (TRAIN_ROOT: only runs whose --out
    # lies below it count; default all of them.)
    [[ $GPU =~ ^[0-9]+$ ]] || { echo "bench: GPU must be the index of a GPU no run holds, got '$GPU'"; exit 2; }
    busy=
    while read -r pid out; do
      [ -n "$pid" ] || continue
      [[ $out == ${TRAIN_ROOT:-/}* ]] || continue
      g=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | sed -n 's/^CUDA_VISIBLE_DEVICES=//p')
      case ",$g," in ",,"|*",$GPU,"*) busy="$busy $pid (${out})" ;; esac
    done <<< "$(ocpmx_pids train)"
    [ -z "$busy" ] || { echo "GPU $GPU is training:$busy"; exit 2; }
    sections=${SECTIONS:-columns}
    CUDA_VISIBLE_DEVICES=$GPU timeout ${BENCH_S:-300} python3 "$PYTHONPATH/ocpmx/benchmarks/gpu_bench.py" \
      --out "${OUT:-/tmp}/bench_${sections// /_}" --sections $sections
    ;;
  poll)
    # wait up to $2 seconds for the batch (and an analysis started here) to end, then bring
    # back what is small
    end=$((SECONDS + ${2:-500}))
    running() { [ -f $ABL/driver.pid ] && kill -0 "$(cat $ABL/driver.pid)" 2>/dev/null; }
    mech_running() { [ -f $ABL/mech.pid ] && kill -0 "$(cat $ABL/mech.pid)" 2>/dev/null; }
    busy() { running || mech_running || [ -n "$(ocpmx_pids ablate analyze)" ]; }
    while [ $SECONDS -lt $end ] && busy; do sleep 15; done
    [ -f $ABL/analyze.log ] && tail -n 5 $ABL/analyze.log
    [ -f $ABL/mech.log ] && cat $ABL/mech.log
    tar czf $OUT/abl.tgz -C "$(dirname $ABL)" --exclude=checkpoints "$(basename $ABL)"
    cat $ABL/driver.log
    for m in $ABL/*/seed*/metrics.jsonl; do
      [ -f "$m" ] || continue
      python3 - "$m" <<'EOF'
import os, sys, time
from ocpmx.llama_train.ablation import wall_eta
from ocpmx.llama_train.metrics import read_metrics
tr, ev = read_metrics(sys.argv[1])
last = tr[-1] if tr else {}
print("/".join(sys.argv[1].split("/")[-3:-1]), "step", last.get("step"), "loss", round(last.get("loss", float("nan")), 4),
      "tok/s", last.get("tokens_per_s"), "| val_loss", ev[-1]["val_loss"] if ev else None,
      "val_loss_recipe", ev[-1].get("val_loss_recipe") if ev else None)
log = os.path.join(os.path.dirname(sys.argv[1]), "log.txt")
eta = wall_eta(open(log, errors="replace").read().splitlines()) if os.path.exists(log) else None
if eta and not os.path.exists(os.path.join(os.path.dirname(sys.argv[1]), "status.json")):
    rate, left, t = eta
    now = time.localtime()
    age = (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec - t) % 86400
    print(f"  {rate:.2f} steps/s of wall time over the last 5 min (evaluations included): "
          f"~{left:.0f} s to its last step; its last log line {age} s ago")
EOF
    done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv 2>/dev/null; true
    ;;
  *) echo "usage: $0 receive | start | analyze | mech | stacks | signal | poll [seconds]"; exit 1 ;;
esac
