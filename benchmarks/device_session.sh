#!/bin/bash
# One GPU session's work, in the background (the device machine goes back after 30 s without a
# call in flight: start this, then poll with device_poll.sh in calls back to back).
#   setsid nohup bash benchmarks/device_session.sh STEPS... > /tmp/ocpmx_run/driver.log 2>&1 &
# Steps: env tests sass bench conform speed. Logs and results go to /tmp/ocpmx_run/.
RUN=/tmp/ocpmx_run
mkdir -p $RUN /tmp/p
ln -sfn "$PWD" /tmp/p/ocpmx
export PYTHONPATH=/tmp/p:$PWD/tests PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
step() { echo "=== $1 start $(date +%T)"; }
done_() { echo "=== $1 done $(date +%T) rc=$2"; }
for s in "$@"; do
  step $s
  case $s in
    env)
      { nvidia-smi; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; git log -1 --format='%H %s'; } > $RUN/env.txt 2>&1
      done_ $s $? ;;
    tests)
      python3 -m pytest tests/test_native_quantize.py tests/test_native_gemm.py tests/test_mxlinear.py \
        tests/test_compile.py -q -n 8 -rA -p no:cacheprovider > $RUN/pytest_gpu.log 2>&1
      done_ $s $? ;;
    sass)
      { python3 benchmarks/kernel_sass.py; python3 benchmarks/kernel_sass.py --qdq; } > $RUN/sass.txt 2>&1
      done_ $s $? ;;
    bench)
      python3 benchmarks/gpu_bench.py --out $RUN/bench --sections quantize > $RUN/bench.log 2>&1
      done_ $s $? ;;
    conform)
      python3 -m ocpmx.cli conform --backend triton --budget quick \
        --report $RUN/conform/triton_gpu_quick.json > $RUN/conform.log 2>&1
      done_ $s $? ;;
    speed)
      bash benchmarks/train_speed.sh $RUN/speed > $RUN/speed.log 2>&1
      done_ $s $? ;;
  esac
done
echo "=== all done $(date +%T)"
