"""Simulator validation plumbing: the bench's trace round trip, the engine's padded programs as
the cpu preset costs them, the calibration file override and the calibration fit."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from flexnpu.__main__ import main as flexnpu_main
from flexnpu.serving.engine import EngineConfig
from flexnpu.serving.runner import RunnerShapes
from flexnpu.serving.scheduler import ScheduledSeq, Sequence
from flexnpu.sim.hardware import CPU_CALIBRATION_ENV, StepTimer, get_preset
from flexnpu.sim.models import get_model
from flexnpu.sim.simulation import InstanceConfig, Simulation
from flexnpu.sim.steptime import EngineShapes
from flexnpu.sim.workload import load_trace

ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=128, block_size=16, max_model_len=256)


def _bench(name: str):
    return importlib.import_module(f"bench.{name}")


def _entry(start: int, n: int, blocks: int, prompt: int = 10_000) -> ScheduledSeq:
    seq = Sequence(object(), prompt, 8, 0.0)
    seq.blocks = list(range(blocks))
    return ScheduledSeq(seq, start, n, True)


def test_bench_trace_round_trips_through_simulate(tmp_path):
    v = _bench("sim_validate")
    reqs = v.make_trace(v.CONFIGS["heavy"], 30.0, seed=3)
    assert len(reqs) > 5
    for r in reqs:  # as the clients record them: sent a little after the planned time
        r.sent = r.planned + 0.01
    trace = tmp_path / "trace.csv"
    v.write_trace(reqs, trace)
    wl = load_trace(trace, max_prompt=256, max_output=256)
    assert len(wl) == len(reqs)
    assert wl.prompt_tokens.tolist() == [r.prompt for r in reqs]
    assert wl.output_tokens.tolist() == [r.output for r in reqs]
    assert np.allclose(wl.arrivals, [r.sent - reqs[0].sent for r in reqs], atol=1e-5)
    assert all(r.prompt + r.output <= ENGINE["max_model_len"] for r in reqs)
    out = tmp_path / "sim.json"
    rc = flexnpu_main(["simulate", "--devices", "1", "--device", "cpu", "--model",
                       "smollm2-135m", "--policies", "chunked-colocate", "--trace", str(trace),
                       "--rate", "0", "--duration", "40", "--seeds", "1", "--max-prompt",
                       "256", "--max-output", "256", "--json", str(out), "--no-progress",
                       *[x for k, val in ENGINE.items()
                         for x in (f"--{k.replace('_', '-')}", str(val))]])
    assert rc == 0
    pol = json.loads(out.read_text())["policies"]["chunked-colocate"]
    assert pol["requests_total"] == len(reqs)
    assert pol["requests_finished"] == len(reqs)


def test_failed_requests_are_reported_by_kind():
    """The emulated split run of issue 42 (seed 0: 34 requests over 4 device seconds at
    time_scale 20, request 7 the one asking 112 tokens): the server shut down 42.5 s into the
    load. Requests 0-6 had finished; the 7 in flight (7-13) ended at the grace period's end
    with finish_reason abort and fewer tokens; the 20 sent later were refused. The report says
    so, instead of "27 requests failed, e.g. 97 tokens of 112"."""
    v = _bench("sim_validate")
    e = _bench("sim_validate_emulated")
    reqs = e.make_phase_trace(e.CONFIGS["emu"], 4.0, 0)
    assert len(reqs) == 34 and reqs[7].output == 112
    for r in reqs:
        r.sent = r.planned * 20
        if r.sent > 42.5:
            r.error = "ConnectError: All connection attempts failed"
        elif r.rid >= 7:
            r.error = f"{r.output * 7 // 8} tokens of {r.output} (finish_reason abort)"
    with pytest.raises(RuntimeError) as failed:
        v.measured_requests(reqs)
    assert str(failed.value) == (
        "27 of 34 requests failed: 7 x fewer tokens than asked, finish_reason abort (first: "
        "request 7 sent at 14.1 s: 98 tokens of 112 (finish_reason abort)); 20 x ConnectError: "
        "All connection attempts failed (first: request 14 sent at 43.3 s: ConnectError: All "
        "connection attempts failed)"
    )


def test_engine_shapes_pick_the_runners_programs():
    shapes = EngineShapes.of_engine(**ENGINE)
    ec = EngineConfig(**ENGINE)
    runner = RunnerShapes(num_seqs=8, block_size=16, num_blocks=ec.blocks_per_instance(),
                          max_blocks_per_seq=ec.max_blocks_per_seq,
                          chunk_buckets=ec.resolved_chunk_buckets(),
                          decode_widths=ec.resolved_decode_widths())
    assert shapes.chunk_buckets == runner.chunk_buckets == (64, 128)
    assert shapes.decode_widths == runner.widths == (4, 16)
    assert shapes.programs() == [(c, w) for _, c, w in _runner_programs(runner)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        decodes = [_entry(0, 1, int(rng.integers(1, 17)), prompt=0)
                   for _ in range(int(rng.integers(0, 9)))]
        chunk = [_entry(0, int(rng.integers(2, 129)), 8)] if rng.random() < 0.5 or not \
            decodes else []
        c, w = shapes.program(decodes + chunk)
        if chunk:
            assert (c, w) == (runner.chunk_bucket(chunk[0].num_tokens), 16)
        else:
            longest = max(len(e.seq.blocks) for e in decodes)
            assert (c, w) == (0, runner.decode_width(longest))


def _runner_programs(sh: RunnerShapes):
    return [*(("step", 0, w) for w in sh.widths),
            *(("step", c, sh.max_blocks_per_seq) for c in sh.chunk_buckets)]


def test_cpu_preset_costs_the_padded_program_not_the_batch():
    ic = InstanceConfig(**ENGINE)
    cpu = StepTimer.create(get_model("smollm2-135m"), get_preset("cpu"), 1, ic)
    one = [_entry(40, 1, 3, prompt=0)]
    eight = [_entry(40, 1, 3, prompt=0) for _ in range(8)]
    assert cpu.step_cost(one) == cpu.step_cost(eight)  # 8 rows are computed either way
    assert cpu.step_cost([_entry(0, 65, 5)]) == cpu.step_cost([_entry(0, 128, 8)])
    assert cpu.step_cost([_entry(0, 64, 4)]) < cpu.step_cost([_entry(0, 65, 5)])
    long_rows = [_entry(100, 1, 7, prompt=0)]  # 7 blocks: past the narrow width 4
    assert cpu.step_cost(one) < cpu.step_cost(long_rows)
    # An accelerator preset (a runtime with kernels sized to the batch) costs the batch.
    h100 = StepTimer.create(get_model("smollm2-135m"), get_preset("h100"), 1, ic)
    assert h100.shapes is None
    assert h100.step_cost(one) < h100.step_cost(eight)


def test_cpu_preset_schedules_like_the_engine():
    sim = Simulation(model=get_model("smollm2-135m"), preset=get_preset("cpu"), devices=1,
                     parallel=1, policy="chunked-colocate", instance=InstanceConfig(**ENGINE))
    (inst,) = sim.instances
    assert inst.sched.config.max_prefill_seqs == 1  # the runner takes one prompt chunk
    assert inst.max_inflight == 2  # step k+1 is dispatched before step k is waited for
    h100 = Simulation(model=get_model("smollm2-135m"), preset=get_preset("h100"), devices=1,
                      parallel=1, policy="chunked-colocate", instance=InstanceConfig(**ENGINE))
    assert h100.instances[0].sched.config.max_prefill_seqs == 0
    assert h100.instances[0].max_inflight == 1


def test_engine_runtime_split_layout_has_the_engines_scheduler():
    # The engine gives every instance one scheduler config, its prefill instances included:
    # chunked prefill at the token budget, its batch and a pool of full-length sequences.
    sim = Simulation(model=get_model("smollm2-135m"), preset=get_preset("cpu"), devices=2,
                     parallel=1, policy="static-pd", instance=InstanceConfig(**ENGINE),
                     num_prefill=1)
    pre, dec = (x.sched.config for x in sim.instances)
    for c in (pre, dec):
        assert c.chunked_prefill and c.mixed_batches and c.max_prefill_seqs == 1
        assert c.max_num_seqs == ENGINE["max_num_seqs"]
        assert c.num_blocks == ENGINE["max_num_seqs"] * ENGINE["max_model_len"] // 16
    h100 = Simulation(model=get_model("smollm2-135m"), preset=get_preset("h100"), devices=2,
                      parallel=1, policy="static-pd", instance=InstanceConfig(**ENGINE),
                      num_prefill=1)
    assert not h100.instances[0].sched.config.chunked_prefill  # whole-prompt prefill there


def test_cpu_calibration_file_override(tmp_path, monkeypatch):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"eff_compute": 0.5, "eff_memory": 0.25, "launch_s": 0.125,
                               "source": "a test calibration"}))
    monkeypatch.setenv(CPU_CALIBRATION_ENV, str(cal))
    p = get_preset("cpu")
    assert (p.eff_compute, p.eff_memory, p.launch_s) == (0.5, 0.25, 0.125)
    assert p.efficiency_source == "a test calibration"
    timer = StepTimer.create(get_model("smollm2-135m"), p, 1)
    assert timer.launch_s == 0.125
    monkeypatch.setenv(CPU_CALIBRATION_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=f"{CPU_CALIBRATION_ENV}=.*missing.json: no such"):
        get_preset("cpu")


def test_calibration_fit_recovers_known_efficiencies():
    cal = _bench("sim_calibrate")
    shapes = EngineShapes.of_engine(**ENGINE)
    from flexnpu.sim.steptime import CostModel

    cm = CostModel.load("smollm2-135m")
    dev = get_preset("cpu").device
    ec, em, launch = 0.2, 0.5, 0.05
    rows = []
    for c, w in shapes.programs():
        f, b = cm.flops_bytes(shapes.features(c, w), fused_attention=False)
        s = max(f / (dev.peak_flops * ec), b / (dev.mem_bandwidth * em)) + launch
        rows.append({"chunk": c, "width": w, "seconds": s})
    fec, fem, flaunch, rel = cal.fit(shapes, rows)
    assert max(abs(x) for x in rel) < 0.05
    assert fec == pytest.approx(ec, rel=0.1)
    assert flaunch == pytest.approx(launch, rel=0.2)


def test_probe_requests_each_time_the_program_they_name():
    v = _bench("sim_validate")
    shapes = EngineShapes.of_engine(**v.ENGINE)
    probes = v.probe_requests()
    assert sorted((c, w) for _, _, c, w, _ in probes) == sorted(shapes.programs())
    bs = shapes.block_size
    for prompt, output, chunk, width, what in probes:
        assert prompt + output <= v.ENGINE["max_model_len"]
        if what == "ttft":  # the whole prompt in one step, alone
            assert prompt <= v.ENGINE["max_num_batched_tokens"]
            assert shapes.program([_entry(0, prompt, -(-prompt // bs))]) == (chunk, width)
        else:  # every decode step of the request, alone, runs that width
            for pos in range(prompt, prompt + output - 1):
                row = _entry(pos, 1, pos // bs + 1, prompt=prompt)
                assert shapes.program([row]) == (0, width), (prompt, output, pos)


def test_steps_from_tokens_recovers_the_engines_steps():
    """Two requests streamed by a synthetic engine whose steps take known times: the clients'
    token times give back each busy step's time and program; the idle gap is no step."""
    v = _bench("sim_validate")
    shapes = EngineShapes.of_engine(**v.ENGINE)
    a = {"prompt": 40, "sent_s": 0.0, "token_times_s": [0.3, 0.4, 0.5, 0.6, 0.85, 0.95]}
    # b arrives while a decodes: its prompt step (a's 5th token, b's first) takes 0.25 s, then
    # both decode; a row's token reaches the client a few ms after the step's other rows.
    b = {"prompt": 70, "sent_s": 0.45, "token_times_s": [0.852, 0.951, 1.05]}
    late = {"prompt": 10, "sent_s": 5.0, "token_times_s": [5.3, 5.4]}  # after an idle gap
    steps = v.steps_from_tokens([a, b, late], shapes)
    got = [(round(s["seconds"], 3), s["rows"], s["first_tokens"], s["chunk"], s["width"])
           for s in steps]
    assert got == [(0.1, 1, 0, 0, 4), (0.1, 1, 0, 0, 4), (0.1, 1, 0, 0, 4),  # a: <= 3 blocks
                   (0.252, 2, 1, 128, 16),  # b's 70-token prompt: the 128 bucket
                   (0.099, 2, 0, 0, 16), (0.099, 1, 0, 0, 16),  # b at 71, 72 tokens: 5 blocks
                   (0.1, 1, 0, 0, 4)]  # late's second token; the idle 1.05 -> 5.3 is no step
    cal = {"programs": [{"chunk": 0, "width": 4, "seconds": 0.08, "model_error": 0.25},
                        {"chunk": 128, "width": 16, "seconds": 0.3}]}
    summary = {(r["chunk"], r["width"]): r for r in v.step_summary(steps, cal)}
    assert summary[(0, 4)]["steps"] == 4
    assert summary[(0, 4)]["p50_s"] == pytest.approx(0.1)
    assert summary[(0, 4)]["model_s"] == pytest.approx(0.1)
    assert summary[(128, 16)]["model_s"] == pytest.approx(0.3)
    assert summary[(0, 16)]["steps"] == 2
    assert np.isnan(summary[(0, 16)]["model_s"])


def test_measured_run_is_analysed_again_from_its_file(tmp_path):
    """--from-measured: a stored measurement (here synthetic: every request alone, TTFT and
    TPOT as probed) is simulated with each calibration; the preset calibration is fitted to the
    mean of every probe set, never to the load."""
    v = _bench("sim_validate")
    reqs = v.make_trace(v.CONFIGS["light"], 60.0, seed=1)
    probes = {k: [{"chunk": c, "width": w, "seconds": (0.4 if c else 0.15) * f,
                   "samples": [(0.4 if c else 0.15) * f]}
                  for c, w in EngineShapes.of_engine(**v.ENGINE).programs()]
              for k, f in (("before", 1.0), ("after", 1.2))}
    per_request = [{"prompt": r.prompt, "output": r.output, "sent_s": r.planned,
                    "ttft_s": 0.5, "tpot_s": 0.165,
                    "token_times_s": [r.planned + 0.5 + 0.165 * k for k in range(r.output)]}
                   for r in reqs]
    m = {"config": v.CONFIGS["light"].__dict__, "devices": 1, "platform": "cpu", "nice": None,
         "seed": 1, "load_average": {}, "probes": probes, "tpot_by_rows": [],
         "per_request": per_request}
    f = tmp_path / "measured_light.json"
    f.write_text(json.dumps(m))
    rc = v.main(["--from-measured", str(f), "--keep", str(tmp_path), "--json",
                 str(tmp_path / "out.json")])
    assert rc == 0
    (res,) = json.loads((tmp_path / "out.json").read_text())["results"]
    assert set(res["sim"]) >= {"mean", "before", "after"}
    assert all(n == len(reqs) for n in res["sim_requests_finished"].values())
    mean = {(r["chunk"], r["width"]): r["seconds"] for r in res["calibrations"]["mean"]["programs"]}
    assert mean[(0, 4)] == pytest.approx(0.15 * 1.1)
    assert res["real"]["tpot_s"]["p50"] == pytest.approx(0.165)
    decode = [s for s in res["steps"] if s["chunk"] == 0]
    assert decode and all(s["p50_s"] == pytest.approx(0.165) for s in decode)
    doc = v.preset_calibration([res, res], "cpu", -15)
    cal = {(r["chunk"], r["width"]): r["seconds"] for r in doc["programs"]}
    assert cal[(64, 16)] == pytest.approx(0.4 * 1.1)
    assert len(doc["programs"][0]["samples"]) == 4


EMULATED_STEPS = """
import json, sys
import jax, jax.numpy as jnp
from flexnpu import stats
from flexnpu.serving.config import RANDOM_PRESETS
from flexnpu.serving.model import random_params
from flexnpu.serving.runner import ModelSteps, Runner, RunnerShapes
from flexnpu.sim.steptime import EngineShapes

sh = EngineShapes.of_engine(**json.loads(sys.argv[1]))
cfg = RANDOM_PRESETS["smollm2-135m"]
shapes = RunnerShapes(num_seqs=sh.rows, block_size=sh.block_size,
                      num_blocks=sh.rows * sh.max_blocks, max_blocks_per_seq=sh.max_blocks,
                      chunk_buckets=sh.chunk_buckets, decode_widths=sh.decode_widths)
steps = ModelSteps(cfg, sh.block_size)
runner = Runner(steps, random_params(cfg, 0, jnp.bfloat16), jax.devices()[0], shapes,
                jnp.bfloat16)

def busy():
    return stats.clients()[0]["modelled_device_time"][0]["busy_s"]

out = []
for chunk, width in sh.programs():
    inp = runner.device_inputs(runner._padding_inputs(chunk, width))
    jax.block_until_ready(inp)
    before = busy()
    ids, _, _, _, runner.ck, runner.cv = steps.step(runner.params, runner.ck, runner.cv, inp)
    ids.block_until_ready()
    out.append([chunk, width, busy() - before])
print("RESULT" + json.dumps(out))
"""


def test_flexnpu_runtime_steps_take_the_emulated_backends_device_time(tmp_path, monkeypatch):
    # simulate --runtime flexnpu on a preset: a step of the engine's program lasts what that
    # very program is modelled to take on emulated devices of the preset.
    from _subprocess import run_python

    monkeypatch.setenv("FLEXNPU_SIM_PROGRAM_CACHE", str(tmp_path))
    env = {
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": "emulate:910c",
        "FLEXNPU_BACKEND_OPTIONS": "device_count=1",
    }
    proc = run_python(EMULATED_STEPS.replace("sys.argv[1]", repr(json.dumps(ENGINE))), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    emulated = {(c, w): s for c, w, s in json.loads(line[len("RESULT") :])}
    preset = get_preset("910c", "flexnpu")
    assert preset.runtime.padded_programs and preset.runtime.analysed_programs
    timer = StepTimer.create(get_model("smollm2-135m"), preset, 1, InstanceConfig(**ENGINE))
    assert set(emulated) == set(timer.shapes.programs())
    for (chunk, width), device_s in emulated.items():
        assert timer.seconds(*timer.program_cost(chunk, width)) == pytest.approx(
            device_s, rel=1e-6
        ), (chunk, width)
    # A chunk step costs more than the widest decode step (its program has the rows too).
    assert emulated[(128, 16)] > emulated[(0, 16)] > emulated[(0, 4)]
    # The preset's own runtime is unchanged: kernels sized to the batch.
    assert get_preset("910c").runtime.padded_programs is False
    with pytest.raises(ValueError, match="--parallel 1"):
        StepTimer.create(get_model("smollm2-135m"), preset, 2, InstanceConfig(**ENGINE))
