#!/bin/bash
# Wait up to $1 seconds for the background session (device_session.sh) to finish, then copy its
# results to $OUT (one tarball: the 8-file limit) and print the driver log's tail.
RUN=${OCPMX_RUN:-/tmp/ocpmx_run}
end=$((SECONDS + ${1:-500}))
while [ $SECONDS -lt $end ] && ! grep -q "all done" $RUN/driver.log 2>/dev/null; do sleep 10; done
tar czf $OUT/$(basename $RUN).tgz -C $(dirname $RUN) $(basename $RUN) 2>/dev/null
tail -n 30 $RUN/driver.log
for f in $RUN/pytest_gpu.log $RUN/bench.log $RUN/bench_sr.log $RUN/bench_host.log $RUN/bench_columns.log $RUN/column_probe.log $RUN/column_tile_check.txt $RUN/column_fold_check.txt $RUN/fold_codes_sweep.txt $RUN/fold_gemm_ws.txt $RUN/step_shapes.log $RUN/step_both_axes.log $RUN/step_gemms.log $RUN/bench_fold.log $RUN/bench_gemm.log $RUN/bench_linear.log $RUN/mxlinear_host.log $RUN/mxlinear_kernels.log $RUN/fold_probe.log $RUN/fold_tile_sweep.log $RUN/cublas_blockwise.log $RUN/accum.log $RUN/speed.log $RUN/speed_both.log $RUN/speed_cols.log $RUN/bench_linear_both1.log $RUN/conform.log $RUN/conform_fold.log $RUN/fp8_cublas_profile.log $RUN/fp8_cublas_model.log; do
  [ -f $f ] && { echo "--- $f"; tail -n 4 $f; }
done
[ -f $RUN/bench_host/bench.md ] && grep "host time" $RUN/bench_host/bench.md
[ -f $RUN/bench_columns/bench.md ] && grep "columns" $RUN/bench_columns/bench.md | cut -c1-110
[ -f $RUN/bench_colboth/bench.md ] && grep "columns\|copy" $RUN/bench_colboth/bench.md
[ -f $RUN/bench_sr/bench.md ] && grep "quantize\|copy" $RUN/bench_sr/bench.md
true
