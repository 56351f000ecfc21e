#!/bin/bash
# Several trees timed on one device machine, one after another, in the background (the machine
# goes back after 30 s without a call in flight: start, then poll in calls back to back).
#   git archive --format=tar -o .frozen/ocpmx_<NAME>_<sha>.tar <sha> -- . ':(exclude)results' \
#       ':(exclude)docs'                           # on this machine, once per tree
#   bash benchmarks/device_trees.sh start "NAME:STEPS" ["NAME:STEPS" ...]
#   bash benchmarks/device_trees.sh poll SECS      # in the same or later calls
# Each tree (TREES, default .frozen: .frozen/ocpmx_NAME_<sha>.tar) is extracted to
# $TREES_TMP/code_NAME (default /tmp) and runs its own benchmarks/device_session.sh STEPS into
# $TREES_TMP/ocpmx_run_NAME
# (its driver.log there; the environment passes through: TESTS, PYTEST_K, ...). ``poll`` waits
# up to SECS for all of them, then always writes $OUT/runs.tgz (every run folder, finished or
# not) and prints each driver log's tail: keep SECS well below the call's limit_s (a call cut
# at its limit returns nothing written after the cut).
set -u
TREES=${TREES:-.frozen}
ROOT=${TREES_TMP:-/tmp}  # where the trees, their runs and the markers go
case ${1:-} in
  start)
    shift
    rm -f $ROOT/trees_done
    : > $ROOT/trees_run.sh
    for spec in "$@"; do
      name=${spec%%:*}; steps=${spec#*:}
      tar=$(ls "$TREES"/ocpmx_"$name"_*.tar 2>/dev/null | head -1)
      [ -n "$tar" ] || { echo "no $TREES/ocpmx_${name}_*.tar" >&2; exit 2; }
      sha=$(basename "$tar" .tar); sha=${sha##*_}
      rm -rf "$ROOT"/code_"$name" "$ROOT"/ocpmx_run_"$name"
      mkdir -p "$ROOT"/code_"$name" "$ROOT"/ocpmx_run_"$name" && tar xf "$tar" -C "$ROOT"/code_"$name"
      echo "(cd $ROOT/code_$name && OCPMX_RUN=$ROOT/ocpmx_run_$name OCPMX_COMMIT=$sha bash benchmarks/device_session.sh $steps > $ROOT/ocpmx_run_$name/driver.log 2>&1)" >> $ROOT/trees_run.sh
    done
    echo "touch $ROOT/trees_done" >> $ROOT/trees_run.sh
    setsid nohup bash $ROOT/trees_run.sh > $ROOT/trees_run.log 2>&1 &
    echo "started: $*" ;;
  poll)
    end=$((SECONDS + ${2:-300}))
    while [ $SECONDS -lt $end ] && [ ! -f $ROOT/trees_done ]; do sleep 5; done
    [ -f $ROOT/trees_done ] && echo "all trees done" || echo "still running"
    runs=$(cd "$ROOT" && ls -d ocpmx_run_* 2>/dev/null)
    [ -n "$runs" ] && tar czf "${OUT:-$ROOT}"/runs.tgz -C "$ROOT" $runs
    for d in $runs; do echo "## $d"; tail -n 12 "$ROOT"/"$d"/driver.log; done ;;
  *)
    echo "usage: $0 start NAME:STEPS ... | poll SECS" >&2; exit 2 ;;
esac
