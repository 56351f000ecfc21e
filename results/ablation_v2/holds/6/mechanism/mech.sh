for s in 953; do
  ck=/tmp/abl_mech/bf16/seed2/checkpoints/$(printf step_%08d $s)
  until [ -d $ck ]; do
    # the batch ended (or never started) without this checkpoint: nothing to wait for
    if ! kill -0 "$(cat /tmp/abl_mech/driver.pid 2>/dev/null)" 2>/dev/null && [ ! -d $ck ]; then
      echo "$(date +%T) checkpoint $s: the batch is not running and $ck does not exist"; exit 1
    fi
    sleep 5
  done
  echo "$(date +%T) checkpoint $s: analysis starts"
  python3 -m ocpmx.cli ablate analyze --plan v2 --out /tmp/abl_mech/mech/step$s --data /tmp/xl \
    --run /tmp/abl_mech/bf16/seed2 --checkpoints $s --micro-batch 8 > /tmp/abl_mech/mech/step$s.log 2>&1
  rc=$?
  echo "$(date +%T) checkpoint $s: exit $rc"
done
