#!/bin/bash
# One GPU session's work, in the background (the device machine goes back after 30 s without a
# call in flight: start this, then poll with device_poll.sh in calls back to back).
#   OCPMX_COMMIT=<sha> setsid nohup bash benchmarks/device_session.sh STEPS... \
#       > /tmp/ocpmx_run/driver.log 2>&1 &
# A second session on another GPU of the machine (its own folder; create it first, the log
# goes there, and device_poll.sh takes the same OCPMX_RUN):
#   mkdir -p /tmp/ocpmx_run2 && CUDA_VISIBLE_DEVICES=2 OCPMX_RUN=/tmp/ocpmx_run2 setsid nohup \
#       bash benchmarks/device_session.sh STEPS... > /tmp/ocpmx_run2/driver.log 2>&1 &
# (the copy of the working tree on the device carries no usable git history: pass the commit)
# Steps: env tests sass bench sr fold gemm linear linear_both launch columns colboth colprobe
# colcheck colfold shapes both gemms foldsweep foldws kernels host probe sweep cublas cublas_profile cublas_model emulate accum conform
# conform_fold speed speed8b (Llama-8B's layers, LAYERS blocks) speed_both speed_cols foldrows (FOLDROWS_ARGS: its arguments) rowwise linear_ab
# methods foldhost wgmma (WGMMA_ARGS: fold_wgmma_probe.py's arguments) stress (STRESS_ARGS) gluonhost.
# Logs and results go to /tmp/ocpmx_run/ (OCPMX_RUN: another folder, for a second session on
# another GPU of the same machine, CUDA_VISIBLE_DEVICES set).
RUN=${OCPMX_RUN:-/tmp/ocpmx_run}
COMMIT=${OCPMX_COMMIT:-unknown}
# A device machine may keep /tmp from an earlier hold: results of another tree in $RUN would be
# taken for this one's (train_speed.sh skips a configuration whose run is complete). They move
# to $RUN/stale-<their commit>-<time>/ (driver.log stays: the launcher writes it before this
# starts); a second call with the same commit keeps them (to resume the same session's runs).
if [ -d "$RUN" ] && [ "$(cat "$RUN/commit" 2>/dev/null)" != "$COMMIT" -o "$COMMIT" = unknown ]; then
  old=$(ls -A "$RUN" | grep -v -x -e driver.log -e p -e commit -e 'stale-.*')
  if [ -n "$old" ]; then
    stale=$RUN/stale-$(cat "$RUN/commit" 2>/dev/null || echo unknown)-$(date +%Y%m%d%H%M%S)
    mkdir -p "$stale" && (cd "$RUN" && mv $old "$stale/")
    echo "earlier results in $RUN (not tree $COMMIT) moved to $stale"
  fi
fi
mkdir -p "$RUN/conform" "$RUN/p"
echo "$COMMIT" > "$RUN/commit"
ln -sfn "$PWD" "$RUN/p/ocpmx"  # per session: another session may run another tree
export PYTHONPATH=$RUN/p:$PWD/tests PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
step() { echo "=== $1 start $(date +%T)"; }
# train_speed.sh once per value of a tuning variable, into one folder (the run names carry it):
#   speed_each VARIABLE FOLDER DEFAULT_RECIPES VALUE...
speed_each() {
  local var=$1 dir=$2 recipes=$3 v; shift 3
  for v in "$@"; do
    env "$var=$v" bash benchmarks/train_speed.sh $RUN/$dir "${SPEED_PRESETS:-125m}" \
      "${SPEED_RECIPES:-$recipes}" "${SPEED_MODES:-graphs}" >> $RUN/$dir.log 2>&1
  done
}
done_() { echo "=== $1 done $(date +%T) rc=$2"; }
for s in "$@"; do
  step $s
  case $s in
    env)
      { nvidia-smi; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; echo "commit ${OCPMX_COMMIT:-unknown} (the working tree sent from it)"; } > $RUN/env.txt 2>&1
      done_ $s $? ;;
    tests)
      # TESTS: a subset of the files; PYTEST_K: a -k expression; PYTEST_M: a -m expression
      # (default: everything but ``slow``, so the ``exhaustive`` cases run). Eight workers share the GPU
      # test by test (--dist load; pyproject's loadfile kept a file on one worker: two files
      # ran on two workers, 127 cases in ~23 min in the eighteenth session, not finished)
      python3 -m pytest -m "${PYTEST_M:-not slow}" ${PYTEST_K:+-k "$PYTEST_K"} ${TESTS:-tests/test_native_quantize.py tests/test_native_gemm.py \
        tests/test_mxlinear.py tests/test_compile.py tests/test_fold.py tests/test_emulate_gemm.py \
        tests/test_both_axes.py} \
        -q -n 8 --dist load -rA -p no:cacheprovider > $RUN/pytest_gpu.log 2>&1
      done_ $s $? ;;
    sass)
      { python3 benchmarks/kernel_sass.py; python3 benchmarks/kernel_sass.py --qdq; } > $RUN/sass.txt 2>&1
      done_ $s $? ;;
    bench)
      python3 benchmarks/gpu_bench.py --out $RUN/bench --sections quantize > $RUN/bench.log 2>&1
      done_ $s $? ;;
    sr)
      # stochastic rounding against RNE and a copy: rows, columns, FP4/FP6/FP8, gfx950's SR
      python3 benchmarks/gpu_bench.py --out $RUN/bench_sr --sections stochastic > $RUN/bench_sr.log 2>&1
      done_ $s $? ;;
    fold)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_fold --sections fold > $RUN/bench_fold.log 2>&1
      done_ $s $? ;;
    gemm)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_gemm --sections gemm > $RUN/bench_gemm.log 2>&1
      done_ $s $? ;;
    linear)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_linear --sections linear > $RUN/bench_linear.log 2>&1
      done_ $s $? ;;
    columns)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_columns --sections columns > $RUN/bench_columns.log 2>&1
      done_ $s $? ;;
    colboth)
      # along axis 0 through the both-axes module's kernel per tile against this GPU's default
      # and the transpose, quantize and quantize-dequantize, bits compared (a minute or so)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_colboth --sections columns_both > $RUN/bench_colboth.log 2>&1
      done_ $s $? ;;
    colcheck)
      # column tiles timed and their bits checked against the transpose path (exit 1: a tile's
      # bits differ); COLCHECK_TILES: other tiles than the script's default list
      python3 benchmarks/column_tile_check.py ${COLCHECK_TILES:+--tiles $COLCHECK_TILES} \
        > $RUN/column_tile_check.txt 2>&1
      done_ $s $? ;;
    regcap)
      # the axis-0 quantize kernel's two-block tiles under register caps (bits checked)
      python3 benchmarks/both_axes_regcap.py > $RUN/both_axes_regcap.txt 2>&1
      done_ $s $? ;;
    colfold)
      # quantize_folded along tokens (group 4, 2^R) per column tile, timed and its bits checked
      # against the transpose path (exit 1: a tile's bits differ); COLFOLD_TILES: the column
      # kernel's tiles, FOLD_COLUMNS: the axis-0 fold kernel's (COLUMNS,WARPS ...)
      python3 benchmarks/column_tile_check.py --fold ${COLFOLD_TILES:+--tiles $COLFOLD_TILES} \
        ${FOLD_COLUMNS:+--fold-columns $FOLD_COLUMNS} > $RUN/column_fold_check.txt 2>&1
      done_ $s $? ;;
    shapes)
      # the step's quantize-dequantize calls at the small presets' shapes, per tile (exit 1: a
      # tile's bits differ)
      python3 benchmarks/step_shapes.py --presets ${SHAPES_PRESETS:-125m 30m} \
        --out $RUN/step_shapes > $RUN/step_shapes.log 2>&1
      done_ $s $? ;;
    both)
      # quantize-dequantize along both axes in one pass against the two calls, at the step's
      # shapes, per tile (exit 1: a tile's bits differ)
      python3 benchmarks/step_shapes.py --both-axes --presets ${SHAPES_PRESETS:-125m 30m} \
        --out $RUN/step_both_axes > $RUN/step_both_axes.log 2>&1
      done_ $s $? ;;
    gemms)
      # the step's GEMMs at the presets' shapes (GEMMS_PRESETS, else SHAPES_PRESETS), bf16 and
      # MXFP4 per GEMM method
      python3 benchmarks/step_shapes.py --gemms ${GEMM_METHODS:-bf16 fp8 fp8_cublas} \
        --presets ${GEMMS_PRESETS:-${SHAPES_PRESETS:-125m 30m}} --out $RUN/step_gemms > $RUN/step_gemms.log 2>&1
      done_ $s $? ;;
    colprobe)
      python3 benchmarks/column_probe.py --out $RUN/column_probe > $RUN/column_probe.log 2>&1
      done_ $s $? ;;
    launch)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_host --sections host > $RUN/bench_host.log 2>&1
      done_ $s $? ;;
    foldws)
      # the warp-specialized persistent chained folded GEMM (an experiment): bits against the
      # library's chained kernel, time against it and cuBLAS bf16 at Llama-8B shapes
      python3 benchmarks/fold_gemm_ws.py > $RUN/fold_gemm_ws.txt 2>&1
      done_ $s $? ;;
    wgmma)
      # the Gluon folded FP8 GEMM against the library's Triton kernel: bits and speed
      python3 benchmarks/fold_wgmma_probe.py ${WGMMA_ARGS:-} > $RUN/fold_wgmma_probe.md 2>&1
      done_ $s $? ;;
    stress)
      # the Gluon folded GEMM launched many times against the Triton kernel's bits (races)
      python3 benchmarks/fold_wgmma_stress.py ${STRESS_ARGS:-} > $RUN/fold_wgmma_stress.txt 2>&1
      done_ $s $? ;;
    gluonhost)
      # host time of a folded GEMM call: Gluon kernel[grid], fastlaunch, the Triton kernel
      python3 benchmarks/fold_wgmma_host.py > $RUN/fold_wgmma_host.md 2>&1
      done_ $s $? ;;
    foldsweep)
      # the fold of stored codes per program shape (FOLD_BLOCKS, FOLD_WARPS), bits and time
      python3 benchmarks/fold_codes_sweep.py ${FOLDSWEEP_SHAPES:+--shapes $FOLDSWEEP_SHAPES} \
        > $RUN/fold_codes_sweep.txt 2>&1
      done_ $s $? ;;
    kernels)
      # the kernels of one MXLinear forward + backward at 8B shapes (GEMMs against the passes)
      python3 benchmarks/mxlinear_kernels.py --out $RUN/mxlinear_kernels > $RUN/mxlinear_kernels.log 2>&1
      done_ $s $? ;;
    host)
      # (HOST_ARGS: e.g. --methods bf16 fp8_cublas_rowwise --recipes mxfp4_all_h16)
      python3 benchmarks/mxlinear_host_profile.py --out $RUN/mxlinear_host ${HOST_ARGS:-} > $RUN/mxlinear_host.log 2>&1
      done_ $s $? ;;
    probe)
      python3 benchmarks/fold_probe.py --out $RUN/fold_probe --save > $RUN/fold_probe.log 2>&1
      done_ $s $? ;;
    sweep)
      python3 benchmarks/fold_tile_sweep.py --out $RUN/fold_tile_sweep ${SWEEP_ARGS:-} > $RUN/fold_tile_sweep.log 2>&1
      done_ $s $? ;;
    cublas)
      python3 benchmarks/cublas_blockwise_probe.py --out $RUN/cublas_blockwise > $RUN/cublas_blockwise.log 2>&1
      done_ $s $? ;;
    emulate)
      python3 benchmarks/gpu_bench.py --out $RUN/bench_emulate --sections emulate > $RUN/bench_emulate.log 2>&1
      done_ $s $? ;;
    accum)
      bash benchmarks/train_accumulation.sh $RUN/accum "${ACCUM_RECIPES:-mxfp8 mxfp4_all_h16}" \
        hopper_bf16 "${ACCUM_STEPS:-120}" > $RUN/accum.log 2>&1
      done_ $s $? ;;
    conform)
      python3 -m ocpmx.cli conform --backend triton --budget quick \
        --report $RUN/conform/triton_gpu_quick.json > $RUN/conform.log 2>&1
      done_ $s $? ;;
    conform_fold)
      # the fold methods' GEMMs: the fold probe and its model check (issue 17)
      for b in ${FOLD_BACKENDS:-triton_fp8 triton_fp8_exact triton_fp8_cublas triton_fp8_cublas_rowwise}; do
        python3 -m ocpmx.cli conform --backend $b --ops gemm --formats e2m1 e3m2 \
          --report $RUN/conform/${b}_gpu_gemm.json >> $RUN/conform_fold.log 2>&1
        echo "$b exit $?" >> $RUN/conform_fold.log
      done
      done_ $s $? ;;
    foldrows)
      # the whole-row fold's tiles and the rowwise method's passes (issue 17)
      python3 benchmarks/fold_rows_sweep.py --out $RUN/fold_rows ${FOLDROWS_ARGS:-} > $RUN/fold_rows.log 2>&1
      done_ $s $? ;;
    foldhost)
      # host time of the fold paths per call and per MXLinear step, and where it goes (cProfile)
      python3 benchmarks/fold_host.py --out $RUN/fold_host > $RUN/fold_host.log 2>&1
      done_ $s $? ;;
    methods)
      # one recipe trained under GEMM methods against method bf16, several seeds (issue 17)
      bash benchmarks/train_methods.sh $RUN/methods "${METHODS_RECIPE:-mxfp4_all_h16}" \
        "${METHODS:-fp8_cublas_rowwise fp8_cublas}" "${METHODS_STEPS:-300}" \
        "${METHODS_SEEDS:-0 1 2}" > $RUN/methods.log 2>&1
      done_ $s $? ;;
    linear_ab)
      # MXLinear against nn.Linear in interleaved rounds, eager and from a CUDA graph
      # (LINEAR_AB_ARGS: e.g. --shapes 32768x768x2048 8192x4096x14336 --cases ...)
      python3 benchmarks/linear_ab.py --out $RUN/linear_ab ${LINEAR_AB_ARGS:-} > $RUN/linear_ab.log 2>&1
      done_ $s $? ;;
    rowwise)
      python3 benchmarks/cublas_rowwise_probe.py --out $RUN/cublas_rowwise --sections speed > $RUN/cublas_rowwise.log 2>&1
      done_ $s $? ;;
    cublas_model)
      python3 benchmarks/fp8_cublas_model_check.py --out $RUN/fp8_cublas_model > $RUN/fp8_cublas_model.log 2>&1
      done_ $s $? ;;
    cublas_profile)
      python3 benchmarks/fp8_cublas_profile.py --out $RUN/fp8_cublas_profile > $RUN/fp8_cublas_profile.log 2>&1
      done_ $s $? ;;
    speed_both)
      # training speed with MXLinear's both-axes pass on, then off (Tuning.linear_both_axes):
      # the runs' names end in -both1 / -both0
      speed_each OCPMX_LINEAR_BOTH_AXES speed_both "bf16 mxfp4_all mxfp4_all_h16" 1 0
      done_ $s $? ;;
    speed_cols)
      # training speed with quantize-dequantize along axis 0 through the both-axes kernel, then
      # through the column kernel (Tuning.columns_qdq): names end in -cols_<value>
      speed_each OCPMX_COLUMNS_QDQ speed_cols "bf16 mxfp4_wgrad" both_axes kernel
      done_ $s $? ;;
    linear_both)
      # MXLinear at 8B shapes with the both-axes pass on
      OCPMX_LINEAR_BOTH_AXES=1 python3 benchmarks/gpu_bench.py --out $RUN/bench_linear_both1 \
        --sections linear > $RUN/bench_linear_both1.log 2>&1
      done_ $s $? ;;
    speed8b)
      # Llama-8B's layer shapes end to end on one GPU (results/train_speed/h200_8b_4layers/):
      # LAYERS blocks (default 4), 8192 tokens a step, bf16 in each run's own setting
      LAYERS=${LAYERS:-4} SEQ=8192 BATCH=1 bash benchmarks/train_speed.sh $RUN/speed8b 8b \
        "${SPEED_RECIPES:-bf16 mxfp4_all mxfp4_all_h16 mxfp4_wgrad}" "${SPEED_MODES:-graphs eager}" \
        > $RUN/speed8b.log 2>&1
      done_ $s $? ;;
    speed)
      bash benchmarks/train_speed.sh $RUN/speed "${SPEED_PRESETS:-30m 125m}" \
        "${SPEED_RECIPES:-bf16 mxfp4_all mxfp4_all_h16}" "${SPEED_MODES:-eager compiled}" > $RUN/speed.log 2>&1
      done_ $s $? ;;
  esac
done
echo "=== all done $(date +%T)"
