"""The pure parts of bench/sim_vidur_compare.py (no Vidur needed): trace generation and the two
trace formats, Vidur's request metrics, the per-request summary, the table and Vidur's flags."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import sim_vidur_compare as svc
from flexnpu.sim.workload import load_trace


def test_make_trace_is_seeded_and_within_ranges():
    a = svc.make_trace(500, 4.0, 7, (100, 200), (5, 9))
    b = svc.make_trace(500, 4.0, 7, (100, 200), (5, 9))
    c = svc.make_trace(500, 4.0, 8, (100, 200), (5, 9))
    assert np.array_equal(a.arrivals, b.arrivals) and np.array_equal(a.prompt_tokens,
                                                                      b.prompt_tokens)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert a.arrivals[0] == 0.0 and np.all(np.diff(a.arrivals) >= 0)
    assert a.prompt_tokens.min() >= 100 and a.prompt_tokens.max() <= 200
    assert a.output_tokens.min() >= 5 and a.output_tokens.max() <= 9
    # Both ends of the inclusive ranges occur in 500 draws.
    assert {5, 9} <= set(a.output_tokens.tolist())
    assert len(a) == 500


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n >= 1"),
    ({"rate": 0.0}, "rate > 0"),
    ({"prompt": (10, 5)}, "prompt range 10:5"),
    ({"output": (0, 5)}, "output range 0:5"),
])
def test_make_trace_rejects_bad_input(kwargs, message):
    args = {"n": 10, "rate": 1.0, "seed": 0, "prompt": (1, 2), "output": (1, 2), **kwargs}
    with pytest.raises(ValueError, match=message):
        svc.make_trace(**args)


def test_flexnpu_trace_round_trips_through_load_trace(tmp_path):
    tr = svc.make_trace(50, 3.0, 1, (10, 900), (2, 300))
    path = tmp_path / "t.csv"
    svc.write_flexnpu_trace(tr, path)
    wl = load_trace(path, duration=None, rate=None, max_prompt=4096, max_output=4096)
    np.testing.assert_allclose(wl.arrivals, tr.arrivals, atol=1e-6)
    assert wl.prompt_tokens.tolist() == tr.prompt_tokens.tolist()
    assert wl.output_tokens.tolist() == tr.output_tokens.tolist()


def test_vidur_trace_has_vidurs_columns_and_one_date(tmp_path):
    tr = svc.Trace(np.array([0.0, 0.25, 1.5]), np.array([7, 8, 9]), np.array([1, 2, 3]))
    path = tmp_path / "v.csv"
    svc.write_vidur_trace(tr, path)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"]
    assert {r["Date"] for r in rows} == {svc.VIDUR_TRACE_DATE}
    assert [float(r["Time"]) for r in rows] == [0.0, 0.25, 1.5]
    assert [int(r["PromptTokenCount"]) for r in rows] == [7, 8, 9]
    assert [int(r["CompletionTokenCount"]) for r in rows] == [1, 2, 3]


def test_summarize_defines_tpot_over_the_tokens_after_the_first():
    ttft = np.array([0.1, 0.2, 0.3])
    e2e = np.array([1.1, 0.2, 2.3])
    n_out = np.array([11, 1, 5])  # the 1-token request has no TPOT
    s = svc.summarize(ttft, e2e, n_out)
    assert s["requests"] == 3
    assert s["tpot_s"]["p50"] == pytest.approx(np.percentile([0.1, 0.5], 50))
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["e2e_s"]["p99"] == pytest.approx(np.percentile(e2e, 99))
    empty = svc.summarize(np.array([]), np.array([]), np.array([], dtype=int))
    assert np.isnan(empty["ttft_s"]["p50"]) and empty["requests"] == 0


def _write_request_metrics(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_read_vidur_requests(tmp_path):
    path = tmp_path / "request_metrics.csv"
    _write_request_metrics(path, [
        {"Request Id": 0, "request_e2e_time": 2.0, "prefill_e2e_time": 0.5,
         "request_num_decode_tokens": 4.0},
        {"Request Id": 1, "request_e2e_time": 1.0, "prefill_e2e_time": 0.1,
         "request_num_decode_tokens": 10.0},
    ])
    s = svc.read_vidur_requests(path)
    assert s["requests"] == 2
    assert s["ttft_s"]["p50"] == pytest.approx(0.3)
    assert s["tpot_s"]["p50"] == pytest.approx((0.5 + 0.1) / 2)  # 1.5 / 3 and 0.9 / 9
    assert s["e2e_s"]["p50"] == pytest.approx(1.5)


def test_read_vidur_requests_names_missing_columns(tmp_path):
    path = tmp_path / "request_metrics.csv"
    _write_request_metrics(path, [{"Request Id": 0, "request_e2e_time": 1.0}])
    with pytest.raises(ValueError, match="prefill_e2e_time, request_num_decode_tokens"):
        svc.read_vidur_requests(path)


def test_find_request_metrics_looks_in_vidurs_timestamped_dirs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no request_metrics.csv"):
        svc.find_request_metrics(tmp_path)
    sub = tmp_path / "2026-12-01_17-41-14"
    sub.mkdir()
    (sub / "request_metrics.csv").write_text("x\n")
    assert svc.find_request_metrics(tmp_path) == sub / "request_metrics.csv"


def test_comparison_table_gives_ratios():
    def side(scale: float, n: int) -> dict:
        q = {"p50": 0.1 * scale, "p90": 0.2 * scale, "p99": 0.4 * scale}
        return {"ttft_s": q, "tpot_s": q, "e2e_s": q, "requests": n}

    table = svc.comparison_table(2.0, side(1.0, 10), side(1.5, 9))
    assert "rate 2 req/s: 10 requests finished in Vidur, 9 here" in table
    assert "| TTFT p50 | 100.0 | 150.0 | 1.50 |" in table
    assert "| E2E p99 | 400.0 | 600.0 | 1.50 |" in table
    assert table.count("| 1.50 |") == 9


def test_vidur_args_carry_the_engine_settings(tmp_path):
    engine = svc.Engine(batch_cap=48, max_tokens_in_batch=2048)
    args = svc.vidur_args(trace=tmp_path / "v.csv", out_dir=tmp_path / "o",
                          cache_dir=tmp_path / "c", device="a100", model="llama-3-8b",
                          engine=engine, forest=svc.Forest())
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--replica_config_model_name"] == "meta-llama/Llama-3-8B"
    assert flags["--replica_scheduler_config_type"] == "vllm"
    assert flags["--vllm_scheduler_config_batch_size_cap"] == "48"
    assert flags["--vllm_scheduler_config_max_tokens_in_batch"] == "2048"
    assert flags["--replica_config_num_pipeline_stages"] == "1"
    assert flags["--trace_request_generator_config_trace_file"] == str(tmp_path / "v.csv")
    assert flags["--trace_request_generator_config_time_scale_factor"] == "1"
    assert args[-2:] == ["--no-metrics_config_store_plots",
                         "--no-metrics_config_enable_chrome_trace"]
    assert not any(a.startswith("--sarathi") for a in args)
    sarathi = svc.Engine(batch_cap=32, scheduler="sarathi", chunk_size=256)
    assert sarathi.step_tokens == 256 and engine.step_tokens == 2048
    args = svc.vidur_args(trace=tmp_path / "v.csv", out_dir=tmp_path / "o",
                          cache_dir=tmp_path / "c", device="a100", model="llama-3-8b",
                          engine=sarathi, forest=svc.Forest())
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--replica_scheduler_config_type"] == "sarathi"
    assert flags["--sarathi_scheduler_config_batch_size_cap"] == "32"
    assert flags["--sarathi_scheduler_config_chunk_size"] == "256"
    assert not any(a.startswith("--vllm") for a in args)


def test_cache_key_follows_the_profile_contents(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("1\n")
    k1 = svc.cache_key((a,), svc.Forest())
    a.write_text("2\n")
    assert svc.cache_key((a,), svc.Forest()) != k1
    assert svc.cache_key((a,), svc.Forest(estimators=10)) != svc.cache_key((a,), svc.Forest())


def test_main_reports_missing_profiles(tmp_path, capsys):
    rc = svc.main(["--vidur-profiles", str(tmp_path), "--vidur-python", sys.executable])
    assert rc == 2
    err = capsys.readouterr().err
    assert "mlp.csv does not exist" in err and "data/profiling" in err


def test_main_rejects_lengths_over_max_model_len(tmp_path, capsys):
    rc = svc.main(["--vidur-profiles", str(_dummy_profiles(tmp_path)),
                   "--vidur-python", sys.executable,
                   "--prompt", "100:4000", "--output", "1:200"])
    assert rc == 2
    assert "prompt + output may reach 4200 tokens, over max_model_len 4096" in \
        capsys.readouterr().err


def test_step_cases_count_kv_as_vidur_does():
    cases = dict(svc.step_cases(64))
    assert cases["prefill 1 x 512"] == [(512, 512)]
    assert cases["prefill 4 x 1024"] == [(1024, 1024)] * 4
    assert cases["decode 64 x ctx 1024"] == [(1, 1025)] * 64
    assert "decode 1 x ctx 256" in cases and "decode 16 x ctx 2048" in cases
    assert cases["chunk 448 @1024 + 64 decodes"] == [(448, 1472)] + [(1, 1025)] * 64


def test_parse_vidur_steps_takes_the_last_steps_line():
    text = "INFO noise\nSTEPS [{\"total\": 1.0, \"attention\": 0.5}]\nSTEPS " \
           "[{\"total\": 0.02, \"attention\": 0.01}]\n"
    assert svc.parse_vidur_steps(text) == [{"total": 0.02, "attention": 0.01}]
    with pytest.raises(ValueError, match="no STEPS line"):
        svc.parse_vidur_steps("INFO only\n")


def test_our_step_seconds_matches_the_timer_and_isolates_attention():
    from flexnpu.sim.hardware import StepTimer, get_preset
    from flexnpu.sim.models import get_model

    timer = StepTimer.create(get_model("llama-3-8b"), get_preset("a100"), 1)
    total, attn = svc.our_step_seconds(timer, [(1024, 1024)])
    assert total == pytest.approx(timer.prefill_seconds(1024))
    short, short_attn = svc.our_step_seconds(timer, [(1, 257)] * 32)
    long, long_attn = svc.our_step_seconds(timer, [(1, 2049)] * 32)
    # A decode step reads the KV of its context: longer contexts cost more, all of it attention.
    assert long > short and 0 < short_attn < long_attn
    assert long - short == pytest.approx(long_attn - short_attn)


def test_step_table_gives_ratios():
    table = svc.step_table(["decode 1 x ctx 256"], [{"total": 0.010, "attention": 0.001}],
                           [(0.012, 0.002)])
    assert "| decode 1 x ctx 256 | 10.00 | 1.00 | 12.00 | 2.00 | 1.20 |" in table


def test_vidur_driver_is_valid_python():
    compile(svc.VIDUR_DRIVER, "vidur_driver.py", "exec")


def _dummy_profiles(root: Path) -> Path:
    base = root / "compute" / "a100" / "meta-llama" / "Meta-Llama-3-8B"
    base.mkdir(parents=True)
    for name in ("mlp.csv", "attention.csv"):
        (base / name).write_text("x\n")
    return root


def test_main_reports_a_failing_vidur_run(tmp_path, capsys):
    # This interpreter has no vidur: the driver's import fails, the run exits non-zero.
    rc = svc.main(["--vidur-profiles", str(_dummy_profiles(tmp_path / "p")), "--vidur-python",
                   sys.executable, "--work-dir", str(tmp_path / "w"), "--rates", "1"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "Vidur exited 1" in err and "vidur_steps.log" in err
    assert "ModuleNotFoundError: No module named 'vidur'" in err


def test_main_reports_a_missing_interpreter_and_bad_rates(tmp_path, capsys):
    profiles = _dummy_profiles(tmp_path / "p")
    rc = svc.main(["--vidur-profiles", str(profiles), "--vidur-python",
                   str(tmp_path / "no-such-python"), "--work-dir", str(tmp_path / "w")])
    assert rc == 1 and "no-such-python" in capsys.readouterr().err
    rc = svc.main(["--vidur-profiles", str(profiles), "--vidur-python", sys.executable,
                   "--rates", "2,fast"])
    assert rc == 2 and "--rates: 'fast' is not a number of requests/s" in \
        capsys.readouterr().err
