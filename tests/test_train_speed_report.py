"""``benchmarks/train_speed_report.py``: the training-speed table from a folder of runs: the
median tokens/s over steps 10-39 without the profiled steps, ratios to bf16 in the same mode,
GPU busy and host time from the profiled step, and breakdowns written before the host field
existed."""
import importlib.util
import json
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_speed_report.py"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("train_speed_report", REPORT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root: Path, name: str, recipe: str, compile_mode, tps: float, breakdown: dict | None,
         **facts):
    d = root / name
    d.mkdir()
    cfg = dict(preset="30m", recipe=recipe, compile=compile_mode is not None,
               compile_mode=compile_mode or "default", batch_size=32, grad_accum=1,
               seq_len=1024, profile_step=30, gemm_method_run=None if recipe == "bf16" else "bf16",
               **facts)
    (d / "config.json").write_text(json.dumps(cfg))
    rows = [dict(step=s, loss=5.0, tokens_per_s=(1e9 if s in (30, 31) else tps + s), mfu=0.1)
            for s in range(40)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if breakdown is not None:
        (d / "step_breakdown.json").write_text(json.dumps(breakdown))


def test_table_medians_ratios_and_host_time(tmp_path, report):
    _run(tmp_path, "30m-bf16-graphs", "bf16", "reduce-overhead", 1000.0,
         {"gpu_ms_per_step": {"gemm": 20.0, "other": 10.0}, "host_ops_ms_per_step": 12.5})
    _run(tmp_path, "30m-mx-graphs", "mxfp4_wgrad", "reduce-overhead", 800.0,
         {"gpu_ms_per_step": {"gemm": 20.0, "quantize": 20.0}})  # (an older breakdown)
    _run(tmp_path, "30m-mx-eager", "mxfp4_wgrad", None, 700.0, None)
    report.main(tmp_path)
    rows = {r["run"]: r for r in json.loads((tmp_path / "train_speed.json").read_text())}
    # steps 10-39 less the profiled 30 and 31 (whose 1e9 would dominate a mean): median of
    # tps + 10 ... tps + 39 without 30, 31
    steps = [s for s in range(10, 40) if s not in (30, 31)]
    median = (steps[len(steps) // 2 - 1] + steps[len(steps) // 2]) / 2
    assert rows["30m-bf16-graphs"]["tokens_per_s"] == 1000.0 + median
    assert rows["30m-bf16-graphs"]["mode"] == "graphs" and rows["30m-mx-eager"]["mode"] == "eager"
    assert rows["30m-bf16-graphs"]["host_ops_ms"] == 12.5
    assert rows["30m-mx-graphs"]["host_ops_ms"] is None
    assert rows["30m-mx-graphs"]["gpu_busy_ms"] == 40.0
    lines = (tmp_path / "train_speed.md").read_text().splitlines()
    assert "host ops ms" in lines[0] and lines[1].count("|") == lines[0].count("|")
    mx = next(line for line in lines if "mxfp4_wgrad | graphs" in line)
    assert mx.endswith(f"| — | {(800.0 + median) / (1000.0 + median):.2f} |")
    assert "| bf16 | graphs | — | — | — | 1,0" in next(x for x in lines if "| bf16 | graphs |" in x)
    eager = next(line for line in lines if "mxfp4_wgrad | eager" in line)
    assert eager.endswith("| — | — | — | nan |")  # no bf16 eager run, no breakdown


def test_a_run_without_timed_steps_is_a_row_that_says_so(tmp_path, report):
    """A run that stopped before step 10 (a failed compile, say) leaves a metrics file with no
    timed step: its row says so, with as many columns as the others, and the table of the
    other runs is still written."""
    _run(tmp_path, "30m-bf16-graphs", "bf16", "reduce-overhead", 1000.0, None)
    d = tmp_path / "30m-mx-graphs"
    _run(tmp_path, d.name, "mxfp4_all", "reduce-overhead", 800.0, None)
    (d / "metrics.jsonl").write_text("")  # nothing logged
    report.main(tmp_path)
    rows = {r["run"]: r for r in json.loads((tmp_path / "train_speed.json").read_text())}
    assert rows["30m-mx-graphs"]["timed_steps"] == 0 and rows["30m-mx-graphs"]["step_ms"] is None
    lines = (tmp_path / "train_speed.md").read_text().splitlines()
    failed = next(line for line in lines if "mxfp4_all" in line)
    assert "no timed step" in failed and failed.count("|") == lines[0].count("|")
    assert any("| bf16 | graphs |" in line and line.endswith("| 1.00 |") for line in lines)


def test_both_axes_column_and_ratios_within_a_setting(tmp_path, report):
    """The both-axes column reads config.json's ``linear_both_axes_run``, or for runs written
    before it the ``-both1`` / ``-both0`` of train_speed.sh's names (bf16: no MX GEMM, so none);
    each ratio is against the bf16 run of the same setting."""
    for b, base in ((1, 1000.0), (0, 900.0)):
        _run(tmp_path, f"30m-bf16-graphs-both{b}", "bf16", "reduce-overhead", base, None)
        _run(tmp_path, f"30m-mxfp4_all-graphs-both{b}", "mxfp4_all", "reduce-overhead", 800.0,
             None)
    _run(tmp_path, "30m-bf16-eager", "bf16", None, 1000.0, None, linear_both_axes_run=None)
    _run(tmp_path, "30m-mxfp4_all-eager", "mxfp4_all", None, 500.0, None,
         linear_both_axes_run=True)
    report.main(tmp_path)
    rows = {r["run"]: r for r in json.loads((tmp_path / "train_speed.json").read_text())}
    assert [rows[f"30m-mxfp4_all-graphs-both{b}"]["linear_both_axes_run"]
            for b in (1, 0)] == [True, False]
    assert rows["30m-bf16-graphs-both1"]["linear_both_axes_run"] is None
    assert rows["30m-mxfp4_all-eager"]["linear_both_axes_run"] is True
    lines = (tmp_path / "train_speed.md").read_text().splitlines()
    steps = [s for s in range(10, 40) if s not in (30, 31)]
    median = (steps[len(steps) // 2 - 1] + steps[len(steps) // 2]) / 2

    def line(recipe, mode, both):
        return next(x for x in lines if f"| {recipe} | {mode} | bf16 | {both} |" in x)
    assert line("mxfp4_all", "graphs", "on").endswith(
        f"| {(800.0 + median) / (1000.0 + median):.2f} |")
    assert line("mxfp4_all", "graphs", "off").endswith(
        f"| {(800.0 + median) / (900.0 + median):.2f} |")
    assert sum(1 for x in lines if "| bf16 | graphs | — | — (set off) | both0 |" in x) == 1
    assert line("mxfp4_all", "graphs", "on").count("| both1 |") == 1  # (the setting column)
    assert line("mxfp4_all", "eager", "on").endswith(
        f"| {(500.0 + median) / (1000.0 + median):.2f} |")


def test_settings_in_names_pick_their_bf16(tmp_path, report):
    """Run names carry the settings after PRESET-RECIPE-MODE (a GEMM method, -cols_<value>):
    each run is compared with the bf16 run of the same settings, else with the plain one."""
    _run(tmp_path, "30m-bf16-graphs", "bf16", "reduce-overhead", 1000.0, None)
    _run(tmp_path, "30m-bf16-graphs-cols_both_axes", "bf16", "reduce-overhead", 500.0, None)
    _run(tmp_path, "30m-mxfp4_wgrad-graphs-cols_both_axes", "mxfp4_wgrad", "reduce-overhead",
         400.0, None)
    _run(tmp_path, "30m-mxfp4_wgrad-graphs-fp8", "mxfp4_wgrad", "reduce-overhead", 800.0, None)
    report.main(tmp_path)
    lines = (tmp_path / "train_speed.md").read_text().splitlines()
    steps = [s for s in range(10, 40) if s not in (30, 31)]
    median = (steps[len(steps) // 2 - 1] + steps[len(steps) // 2]) / 2
    rows = [x for x in lines if "| mxfp4_wgrad |" in x]
    assert sorted(x.rsplit("|", 2)[1].strip() for x in rows) == sorted(
        [f"{(400.0 + median) / (500.0 + median):.2f}",
         f"{(800.0 + median) / (1000.0 + median):.2f}"])


def test_a_setting_compares_with_bf16_of_its_closest_setting(tmp_path, report):
    """A run named with a GEMM method and the layer count (``-bf16-L4``: GEMM_METHOD=bf16
    LAYERS=4) compares with bf16 of ``-L4`` (bf16 runs take no GEMM method), not with another
    setting's bf16 or a plain one of other shapes."""
    assert report.baseline_settings("-bf16-L4") == ["-bf16-L4", "-L4", ""]
    assert report.baseline_settings("") == [""] and report.baseline_settings(None) == [None, ""]
    _run(tmp_path, "30m-bf16-graphs", "bf16", "reduce-overhead", 4000.0, None)
    _run(tmp_path, "30m-bf16-graphs-L4", "bf16", "reduce-overhead", 1000.0, None)
    _run(tmp_path, "30m-mxfp4_all-graphs-bf16-L4", "mxfp4_all", "reduce-overhead", 1100.0, None)
    _run(tmp_path, "30m-mxfp4_all-graphs-L2", "mxfp4_all", "reduce-overhead", 1200.0, None)
    # (a setting after -both0 still names the pass: a run written before config.json said)
    _run(tmp_path, "30m-mxfp4_all-graphs-both0-L4", "mxfp4_all", "reduce-overhead", 900.0, None)
    report.main(tmp_path)
    rows = {r["run"]: r for r in json.loads((tmp_path / "train_speed.json").read_text())}
    assert rows["30m-mxfp4_all-graphs-both0-L4"]["linear_both_axes_run"] is False
    lines = (tmp_path / "train_speed.md").read_text().splitlines()
    four = next(line for line in lines if "| bf16-L4 |" in line)
    two = next(line for line in lines if "| L2 |" in line)
    steps = [s for s in range(10, 40) if s not in (30, 31)]
    median = (steps[len(steps) // 2 - 1] + steps[len(steps) // 2]) / 2
    assert four.endswith(f"| {(1100 + median) / (1000 + median):.2f} |")
    assert two.endswith(f"| {(1200 + median) / (4000 + median):.2f} |")  # (no bf16 -L2: plain)
