"""benchmarks/determinism_check.sh with a stand-in training (no GPU): the four runs are started
with and without ``--deterministic`` and the comparison names the first step whose loss or
gradient norm differs, bit for bit."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "determinism_check.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# a stand-in `python3`: `-m ocpmx.cli train` writes 5 steps of metrics (the --deterministic runs
# identical; the plain runs equal to them up to step 2, then each its own last bits), anything
# else goes to the real interpreter
FAKE = r'''#!/bin/bash
if [ "$1 $2 $3" = "-m ocpmx.cli train" ]; then
  out=""; det=0; prev=""
  for a in "$@"; do
    [ "$prev" = "--out" ] && out=$a
    [ "$a" = "--deterministic" ] && det=1
    prev=$a
  done
  exec "REAL" -c '
import json, os, sys
out, det = sys.argv[1], sys.argv[2] == "1"
os.makedirs(out)
own = 0.0 if det else (1e-7 if out.endswith("_a") else 2e-7)
rows = []
for s in range(5):
    loss = 10.0 - s + (own if s >= 3 else 0.0)
    rows.append({"step": s, "tokens": 100 * (s + 1), "loss": loss, "grad_norm": 1.0 + s,
                 "tokens_per_s": 1000.0 + s})
rows.append({"step": 4, "tokens": 500, "val_loss": 6.0 + own})
open(os.path.join(out, "metrics.jsonl"), "w").write("".join(json.dumps(r) + "\n" for r in rows))
' "$out" "$det"
fi
exec "REAL" "$@"
'''


def test_compares_the_pairs_bit_for_bit(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(FAKE.replace("REAL", sys.executable))
    (bin_ / "python3").chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "DATA": str(data),
           "OCPMX_COMMIT": "abc1234", "HOME": str(tmp_path), "RUNS_DIR": str(tmp_path / "runs"),
           "PKG_ROOT": str(tmp_path / "pkg")}
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (tmp_path / "out" / "det" / "summary.txt").read_text()
    assert "det_a vs det_b: first step whose loss or grad_norm differs: None; evaluations " \
           "equal: 1 of 1" in summary
    assert "plain_a vs plain_b: first step whose loss or grad_norm differs: 3; evaluations " \
           "equal: 0 of 1" in summary
    assert "det_a vs plain_a: first step whose loss or grad_norm differs: 3" in summary
    assert "commit abc1234" in (tmp_path / "out" / "det" / "device.txt").read_text()
    for name in ("det_a", "det_b", "plain_a", "plain_b"):  # each run's metrics come back
        rows = (tmp_path / "out" / "det" / f"{name}.metrics.jsonl").read_text().splitlines()
        assert len(rows) == 6 and json.loads(rows[-1])["step"] == 4
