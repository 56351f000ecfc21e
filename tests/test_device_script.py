"""benchmarks/ablation_v2_device.sh, the driver of the ablation's device holds, exercised here
with a stand-in ``python3`` (no GPU, no training): the analysis watcher (``mech``) and the
commit's code archive (``CODE_TAR``)."""
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ablation_v2_device.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _env(tmp_path, rc=0):
    """A PATH whose python3 records its arguments and PYTHONPATH, then exits ``rc``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    fake = bin_ / "python3"
    fake.write_text(f'#!/bin/bash\necho "args: $*"\necho "pythonpath: $PYTHONPATH"\n'
                    f'echo "gpus: ${{CUDA_VISIBLE_DEVICES-all}}"\nexit {rc}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # a GPU host's
    return dict(env, PATH=f"{bin_}:{os.environ['PATH']}", ABL_OUT=str(tmp_path / "abl"),
                XL_DATA=str(tmp_path / "xl"), POLL_S="0.2",
                PKG_LINK_DIR=str(tmp_path / "pkg"))  # (not the developer's /tmp/p)


def _script(mode, env, cwd):
    return subprocess.run(["bash", str(SCRIPT), mode], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def _wait_for(path: Path, text: str, timeout=30.0) -> str:
    end = time.time() + timeout
    while time.time() < end:
        if path.exists() and text in path.read_text():
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{path}: no {text!r} after {timeout} s: "
                         f"{path.read_text() if path.exists() else '(missing)'}")


def test_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_mech_gives_up_without_a_running_batch(tmp_path):
    """No batch running and no checkpoint: the watcher says so and ends (it used to wait
    forever, which kept every poll busy)."""
    env = _env(tmp_path)
    (tmp_path / "abl" / "bf16" / "seed2" / "checkpoints").mkdir(parents=True)
    _script("mech", dict(env, STEPS="953"), tmp_path)
    log = _wait_for(tmp_path / "abl" / "mech.log", "does not exist")
    assert "analysis starts" not in log


def test_mech_analyzes_each_checkpoint_when_it_appears(tmp_path):
    """With the batch running, each checkpoint is analyzed once it exists, with the options
    asked for, and the analysis's own exit status is reported; a second watcher is refused."""
    env = _env(tmp_path, rc=3)
    ck = tmp_path / "abl" / "bf16" / "seed2" / "checkpoints"
    ck.mkdir(parents=True)
    driver = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "abl" / "driver.pid").write_text(str(driver.pid))
        _script("mech", dict(env, STEPS="953 1907", MICRO="8"), tmp_path)
        second = _script("mech", dict(env, STEPS="953"), tmp_path)
        assert second.returncode == 2 and "already running" in second.stdout
        (ck / "step_00000953").mkdir()
        _wait_for(tmp_path / "abl" / "mech.log", "checkpoint 953: exit 3")
        (ck / "step_00001907").mkdir()
        log = _wait_for(tmp_path / "abl" / "mech.log", "checkpoint 1907: exit 3")
    finally:
        driver.kill()
    assert log.index("953: analysis starts") < log.index("1907: analysis starts")
    args = (tmp_path / "abl" / "mech" / "step1907.log").read_text()
    assert "--checkpoints 1907" in args and "--micro-batch 8" in args
    assert f"--out {tmp_path}/abl/mech/step1907" in args
    assert "gpus: all" in args  # no MECH_GPU: whatever the machine shows


def test_mech_on_the_gpu_asked_for(tmp_path):
    """MECH_GPU: the analysis sees only that GPU (a machine of two: the runs' second GPU)."""
    env = _env(tmp_path)
    (tmp_path / "abl" / "bf16" / "seed2" / "checkpoints" / "step_00000953").mkdir(parents=True)
    driver = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "abl" / "driver.pid").write_text(str(driver.pid))
        _script("mech", dict(env, STEPS="953", MECH_GPU="1"), tmp_path)
        _wait_for(tmp_path / "abl" / "mech.log", "checkpoint 953: exit 0")
    finally:
        driver.kill()
    assert "gpus: 1" in (tmp_path / "abl" / "mech" / "step953.log").read_text()


def test_code_tar_runs_the_archive_not_the_tree(tmp_path):
    """CODE_TAR: the processes a call starts import the archive's copy, extracted once."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "marker.txt").write_text("from the archive")
    tar = tmp_path / "tree" / ".frozen" / "ocpmx.tar"
    tar.parent.mkdir(parents=True)
    with tarfile.open(tar, "w") as t:
        t.add(src / "marker.txt", arcname="marker.txt")
    env = _env(tmp_path)
    driver = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "abl").mkdir()
        (tmp_path / "abl" / "driver.pid").write_text(str(driver.pid))
        (tmp_path / "abl" / "bf16" / "seed2" / "checkpoints" / "step_00000953").mkdir(parents=True)
        out = _script("mech", dict(env, STEPS="953", CODE_TAR=".frozen/ocpmx.tar"),
                      tmp_path / "tree")
        code = out.stdout.split("code: ")[1].split("/ocpmx")[0]
        _wait_for(tmp_path / "abl" / "mech.log", "exit 0")
    finally:
        driver.kill()
    assert code.startswith("/tmp/code/")
    assert (Path(code) / "ocpmx" / "marker.txt").read_text() == "from the archive"
    log = (tmp_path / "abl" / "mech" / "step953.log").read_text()
    assert f"pythonpath: {code}" in log
    shutil.rmtree(code)


def test_start_passes_the_gpus_and_runs_per_gpu(tmp_path):
    """``start`` with GPUS and PER_GPU: the batch is started with ``--gpus`` / ``--per-gpu`` as
    asked (a machine of two GPUs: its runs spread over both), the plan's folder and the code."""
    env = _env(tmp_path)
    out = _script("start", dict(env, ARMS="bf16,mxfp4_wgrad", SEEDS="0", PER_GPU="2",
                                GPUS="0,1", PLAN="v2-125m", START_WAIT_S="2"), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    log = (tmp_path / "abl" / "driver.log").read_text()
    assert "ablate run --plan v2-125m" in log and "--arms bf16,mxfp4_wgrad" in log
    assert "--per-gpu 2 --gpus 0,1" in log


def test_stacks_shows_where_a_training_process_waits(tmp_path):
    """``stacks``: every ``ocpmx.cli train`` process of the batch gets SIGUSR1 and, through
    ``metrics.stacks_on_signal`` (what ``ocpmx train`` registers), writes its Python stacks into
    its run's log.txt and goes on; the mode shows the end of each log. Without a training
    process in the batch it says so, whatever trains elsewhere (another batch, another test)."""
    import sys
    env = _env(tmp_path)
    elsewhere = tmp_path / "other" / "bf16" / "seed0"
    elsewhere.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ocpmx.cli",
                              "train", "--out", str(elsewhere)])
    try:
        time.sleep(0.5)
        out = _script("stacks", env, tmp_path)
        assert out.returncode == 2 and "no training process in" in out.stdout
    finally:
        other.kill()
        other.wait()
    run = tmp_path / "abl" / "bf16" / "seed0"
    run.mkdir(parents=True)
    code = ("import time; from ocpmx.llama_train.metrics import stacks_on_signal; "
            "stacks_on_signal(); print('ready', flush=True)\n"
            "def waits_here():\n    time.sleep(60)\nwaits_here()")
    with open(run / "log.txt", "w") as log:  # its command line names ocpmx.cli train
        p = subprocess.Popen([sys.executable, "-c", code, "ocpmx.cli", "train", "--out",
                              str(run)], stdout=log, stderr=log)
    try:
        _wait_for(run / "log.txt", "ready")
        out = _script("stacks", dict(env, STACKS_WAIT_S="1"), tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"== {run / 'log.txt'}" in out.stdout and "waits_here" in out.stdout
        assert p.poll() is None  # still running
    finally:
        p.kill()
        p.wait()


def test_stacks_on_signal_without_a_file_stderr(monkeypatch):
    """A stderr with no file descriptor (a captured one): nothing registered, no error, so
    ``ocpmx train`` runs as before (its bad-input errors stay one line)."""
    import io
    import sys
    from ocpmx.llama_train.metrics import stacks_on_signal
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert stacks_on_signal() is False


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_signal_reaches_only_the_runs_named(tmp_path):
    """``signal``: SIG=STOP / CONT / TERM to the training processes of the runs named, found by
    their argv. A shell whose command line merely names the run (as the device call's own shell
    does) is never signalled: a pattern over command lines stopped that shell once and lost a
    hold. Another run of the batch stays as it was; an unknown run is an error."""
    import sys
    env = _env(tmp_path)
    abl = tmp_path / "abl"
    runs = {r: abl / r for r in ("mxfp4_all/seed1", "mxfp4_all/seed2")}
    procs = {}
    for r, d in runs.items():
        d.mkdir(parents=True)
        procs[r] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                     "ocpmx.cli", "train", "--out", str(d)])
    shell = subprocess.Popen(["bash", "-c", f"sleep 60; echo ocpmx.cli train --out "
                                            f"{runs['mxfp4_all/seed1']}"])
    elsewhere = tmp_path / "other" / "bf16" / "seed0"  # another batch's run: not in RUNS=all
    elsewhere.mkdir(parents=True)
    procs["other"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                       "ocpmx.cli", "train", "--out", str(elsewhere)])
    try:
        time.sleep(0.5)
        a, b = procs["mxfp4_all/seed1"].pid, procs["mxfp4_all/seed2"].pid
        out = _script("signal", dict(env, SIG="SIGSTOP", RUNS="mxfp4_all/seed1"), tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"SIGSTOP -> {a} (mxfp4_all/seed1)" in out.stdout
        time.sleep(0.3)
        assert _state(a) == "T" and _state(b) != "T" and _state(shell.pid) != "T"
        out = _script("signal", dict(env, SIG="CONT", RUNS="mxfp4_all/seed1"), tmp_path)
        assert out.returncode == 0 and f"SIGCONT -> {a}" in out.stdout
        time.sleep(0.3)
        assert _state(a) != "T"
        # one run named does not exist: the others get the signal, the exit says which is missing
        out = _script("signal", dict(env, SIG="CONT", RUNS="mxfp4_all/seed2 mxfp4_all/seed9"),
                      tmp_path)
        assert out.returncode == 2 and f"SIGCONT -> {b}" in out.stdout
        assert "no training process of mxfp4_all/seed9 in" in out.stdout
        out = _script("signal", dict(env, SIG="TERM", RUNS="all"), tmp_path)
        assert out.returncode == 0 and out.stdout.count("SIGTERM") == 2, out.stdout
        assert procs["mxfp4_all/seed1"].wait(10) != 0 and procs["mxfp4_all/seed2"].wait(10) != 0
        assert shell.poll() is None  # the shell that names a run: untouched
        assert procs["other"].poll() is None  # outside this batch's folder: untouched
        out = _script("signal", dict(env, SIG="TERM", RUNS="bf16/seed0"), tmp_path)
        assert out.returncode == 2 and "no training process of bf16/seed0" in out.stdout
        out = _script("signal", env, tmp_path)
        assert out.returncode != 0 and "SIG=STOP|CONT|TERM" in out.stderr
        out = _script("signal", dict(env, SIG="PAUSE", RUNS="all"), tmp_path)
        assert out.returncode == 2 and "SIG=PAUSE: not a signal name" in out.stdout
    finally:
        for p in (*procs.values(), shell):
            p.kill()
            p.wait()


def test_poll_prints_each_running_runs_wall_clock_eta(tmp_path):
    """``poll`` on a batch with a run still going (no status.json): beside its last metrics, its
    wall-clock rate and the seconds to its last step from its log.txt (``wall_eta``), so that a
    hold's plan can be judged while the runs train. A finished run gets no ETA."""
    import sys
    repo = SCRIPT.parents[1]
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").symlink_to(sys.executable)  # the real one: poll reads the metrics
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", ABL_OUT=str(tmp_path / "abl"),
               XL_DATA=str(tmp_path / "xl"), OUT=str(tmp_path / "out"),
               PKG_LINK_DIR=str(tmp_path / "pkg"))
    (tmp_path / "out").mkdir()
    for seed, done in ((0, False), (1, True)):
        d = tmp_path / "abl" / "bf16" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps(
            {"step": 99, "loss": 3.5, "tokens_per_s": 1000.0}) + "\n")
        (d / "log.txt").write_text("10:00:00 step 0/300  loss 9\n10:01:40 step 100/300  loss 3.5\n")
        if done:
            (d / "status.json").write_text('{"status": "done"}')
    # from the repository's root, as on the device (the script links it as /tmp/p/ocpmx; here
    # PKG_LINK_DIR/ocpmx)
    out = subprocess.run(["bash", str(SCRIPT), "poll", "0"], env=env, cwd=repo,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "pkg" / "ocpmx").resolve() == Path(repo).resolve()
    assert out.stdout.count("steps/s of wall time") == 1, out.stdout
    assert "1.00 steps/s of wall time" in out.stdout and "~200 s to its last step" in out.stdout
    assert (tmp_path / "out" / "abl.tgz").stat().st_size > 0


def test_bench_runs_only_on_a_gpu_no_run_holds(tmp_path):
    """``bench``: gpu_bench on GPU $GPU (CUDA_VISIBLE_DEVICES), written under $OUT, while runs
    train on other GPUs; refused on a GPU a training process holds, and on every GPU while one
    runs without CUDA_VISIBLE_DEVICES (it may use any)."""
    import sys
    # TRAIN_ROOT: only this test's runs count (other tests may train beside it)
    env = dict(_env(tmp_path), OUT=str(tmp_path / "out"), TRAIN_ROOT=str(tmp_path))
    run = tmp_path / "abl" / "bf16" / "seed1"
    run.mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    train = [sys.executable, "-c", "import time; time.sleep(60)", "ocpmx.cli", "train",
             "--out", str(run)]
    on_gpu1 = subprocess.Popen(train, env=dict(base, CUDA_VISIBLE_DEVICES="1"))
    anywhere = None
    try:
        time.sleep(0.5)
        out = _script("bench", dict(env, GPU="1"), tmp_path)
        assert out.returncode == 2 and f"GPU 1 is training: {on_gpu1.pid} ({run})" in out.stdout
        assert "args:" not in out.stdout
        out = _script("bench", dict(env, GPU="0", SECTIONS="columns quantize"), tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "gpus: 0" in out.stdout and "benchmarks/gpu_bench.py" in out.stdout
        assert f"--out {tmp_path / 'out'}/bench_columns_quantize --sections columns quantize" \
            in out.stdout
        anywhere = subprocess.Popen(train, env=base)
        time.sleep(0.5)
        out = _script("bench", dict(env, GPU="0"), tmp_path)
        assert out.returncode == 2 and f"GPU 0 is training: {anywhere.pid}" in out.stdout
        out = _script("bench", dict(env, GPU="0", TRAIN_ROOT=str(tmp_path / "nowhere")),
                      tmp_path)
        assert out.returncode == 0 and "gpus: 0" in out.stdout  # runs outside TRAIN_ROOT
        for bad in ({}, {"GPU": "0,1"}):  # no GPU, or not one index: one line, exit 2
            out = _script("bench", dict(env, **bad), tmp_path)
            lines = out.stdout.splitlines()  # (every mode first names the code it runs)
            assert out.returncode == 2 and len(lines) == 2 and lines[0].startswith("code:"), \
                out.stdout + out.stderr
            assert lines[1].startswith("bench: GPU must be the index of a GPU no run holds")
    finally:
        for p in (on_gpu1, anywhere):
            if p is not None:
                p.kill()
                p.wait()


def test_start_checks_the_shards_once_while_they_are_unchanged(tmp_path):
    """``start`` checks every shard's text against PARTS.json (the real check, through the
    actual Python); a later start trusts that check while PARTS.json and every shard file are
    unchanged, and checks again once anything changed: a shard rewritten with the same size
    (and its mtime set back), PARTS.json's text, a shard added or removed; an unreadable mark
    means "check"."""
    import gzip
    import hashlib
    import sys
    env = _env(tmp_path)
    fake = tmp_path / "bin" / "python3"  # the shard check (stdin) runs for real, the rest fakes
    fake.write_text(f'#!/bin/bash\n[ "$1" = - ] && exec {sys.executable} "$@"\n'
                    'echo "args: $*"\nexit 0\n')
    data = tmp_path / "xl"
    data.mkdir()
    shard = data / "c4-train.00000-of-00001.json.gz"
    mark = data / ".shards_checked.json"

    def write(text: bytes, path=shard):
        path.write_bytes(gzip.compress(text, mtime=0))  # (the same size for the same length)

    def parts(**shards):
        (data / "PARTS.json").write_text(json.dumps({"shards": {
            n: hashlib.sha256(t).hexdigest() for n, t in shards.items()}}))

    text = b'{"text": "a document"}\n'
    write(text)
    parts(**{shard.name: text})
    env = dict(env, ARMS="bf16", SEEDS="0", START_WAIT_S="1")  # (0: the log may not exist yet)

    def start():
        out = _script("start", env, tmp_path)
        return out.returncode, out.stdout

    rc, out = start()
    assert rc == 0 and "all 1 shards present and intact\n" in out, out
    rc, out = start()
    assert rc == 0 and "(checked earlier;" in out, out
    # the same size, its mtime set back: the ctime still tells
    st = shard.stat()
    write(b'{"text": "b document"}\n')
    assert shard.stat().st_size == st.st_size
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, out = start()
    assert rc == 2 and "text SHA-256" in out and "checked earlier" not in out, out
    assert not mark.exists()
    write(text)
    rc, out = start()
    assert rc == 0 and "checked earlier" not in out, out
    parts(**{shard.name: text, "c4-validation.00000-of-00001.json.gz": b"v"})  # PARTS changed
    rc, out = start()
    assert rc == 2 and "c4-validation.00000-of-00001.json.gz: missing" in out, out
    write(b"v", data / "c4-validation.00000-of-00001.json.gz")  # the missing shard arrives
    rc, out = start()
    assert rc == 0 and "all 2 shards" in out and "checked earlier" not in out, out
    write(b"x", data / "c4-train.00001-of-00001.json.gz")  # a shard the pack does not list
    rc, out = start()
    assert rc == 2 and "c4-train.00001-of-00001.json.gz: not in the pack" in out, out
    (data / "c4-train.00001-of-00001.json.gz").unlink()
    rc, out = start()
    assert rc == 0 and "checked earlier" not in out, out
    mark.write_text("{not json")  # unreadable: checked again, not a traceback
    rc, out = start()
    assert rc == 0 and "checked earlier" not in out and "Traceback" not in out, out
    rc, out = start()
    assert rc == 0 and "(checked earlier;" in out, out


SESSION = SCRIPT.parent / "device_session.sh"


def test_device_session_moves_another_trees_results_aside(tmp_path):
    """device_session.sh on a machine that kept an earlier hold's /tmp: results of another
    commit move to stale-<commit>-<time>/ before any step (a complete speed run of another tree
    would otherwise be skipped and reported as this tree's); driver.log stays; a second call of
    the same commit keeps its results (a session resumed); an unnamed commit keeps none."""
    run = tmp_path / "run"
    (run / "speed" / "125m-bf16-graphs").mkdir(parents=True)
    (run / "speed" / "125m-bf16-graphs" / "metrics.jsonl").write_text("{}\n")
    (run / "env.txt").write_text("old\n")
    (run / "driver.log").write_text("launcher\n")
    (run / "commit").write_text("aaa\n")

    def session(commit):
        env = dict(os.environ, OCPMX_RUN=str(run))
        env.pop("OCPMX_COMMIT", None)
        if commit:
            env["OCPMX_COMMIT"] = commit
        r = subprocess.run(["bash", str(SESSION)], env=env, cwd=SCRIPT.parents[1],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "moved to" in session("bbb")
    stale = [p for p in run.iterdir() if p.name.startswith("stale-aaa-")]
    assert len(stale) == 1
    assert (stale[0] / "speed" / "125m-bf16-graphs" / "metrics.jsonl").is_file()
    assert (stale[0] / "env.txt").read_text() == "old\n"
    assert not (run / "speed").exists() and (run / "driver.log").read_text() == "launcher\n"
    assert (run / "commit").read_text().strip() == "bbb"
    (run / "speed").mkdir()  # this tree's results, then the same commit again: kept
    assert "moved to" not in session("bbb")
    assert (run / "speed").is_dir()
    assert "moved to" in session(None)  # no commit named: nothing can be trusted as this tree's
    assert not (run / "speed").exists()
    assert (run / "commit").read_text().strip() == "unknown"
    assert len([p for p in run.iterdir() if p.name.startswith("stale-")]) == 2


TREES = Path(__file__).resolve().parents[1] / "benchmarks" / "device_trees.sh"


def _tree(tmp_path, name, sha, body):
    """A tree archive .../trees/ocpmx_NAME_SHA.tar whose device_session.sh runs ``body``."""
    src = tmp_path / f"src_{name}" / "benchmarks"
    src.mkdir(parents=True)
    (src / "device_session.sh").write_text(body)
    trees = tmp_path / "trees"
    trees.mkdir(exist_ok=True)
    subprocess.run(["tar", "cf", str(trees / f"ocpmx_{name}_{sha}.tar"), "-C",
                    str(src.parent), "benchmarks"], check=True)


def test_device_trees_run_one_after_another_and_poll_always_writes_the_runs(tmp_path):
    """``device_trees.sh``: each tree's device_session.sh with its own steps, commit and run
    folder, one after another; ``poll`` writes every run folder to $OUT/runs.tgz whether or not
    the trees are done (a device call cut at its limit returns nothing written later)."""
    import tarfile
    body = ('echo "$OCPMX_COMMIT $* $(date +%s%N)" > "$OCPMX_RUN/out.txt"; '
            'sleep "${SLEEP_S:-0}"; echo "=== all done"\n')
    _tree(tmp_path, "a", "111aaa", body)
    _tree(tmp_path, "b", "222bbb", body)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TREES=str(tmp_path / "trees"), TREES_TMP=str(tmp_path / "run"),
               OUT=str(out), SLEEP_S="1")
    (tmp_path / "run").mkdir()
    r = subprocess.run(["bash", str(TREES), "start", "a:env tests", "b:gemm"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    early = subprocess.run(["bash", str(TREES), "poll", "0"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert "still running" in early.stdout and (out / "runs.tgz").exists()
    done = subprocess.run(["bash", str(TREES), "poll", "20"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "all trees done" in done.stdout
    with tarfile.open(out / "runs.tgz") as t:
        a = t.extractfile("ocpmx_run_a/out.txt").read().decode().split()
        b = t.extractfile("ocpmx_run_b/out.txt").read().decode().split()
    assert a[:3] == ["111aaa", "env", "tests"] and b[:2] == ["222bbb", "gemm"]
    assert int(b[-1]) - int(a[-1]) >= 10**9  # b started after a's one-second session
    missing = subprocess.run(["bash", str(TREES), "start", "c:env"], env=env,
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "ocpmx_c_" in missing.stderr
