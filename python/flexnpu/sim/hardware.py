"""Device presets, links and the step-time model on a device group.

A serving instance runs on a group of `parallel` devices (tensor x expert parallel); the
simulator and the placement core see the group as one unit whose roofline is the sum of its
devices'. A step's time on a unit is

    max(FLOPs / (peak * eff_compute), bytes / (HBM bandwidth * eff_memory)) + launch

with FLOPs and bytes from the HLO analysis (steptime.CostModel) and the efficiency factors fitted
to published per-device figures (Ascend 910C: CloudMatrix-Infer) or to steps measured on this
CPU; collective communication (TP all-reduce, EP all-to-all) is inside the fitted factors.
On one device that is xla_passes::ModelledSeconds, the emulated backend's execution time too;
StepTimer.seconds is its hot-path form (tests/python/test_sim_presets.py holds them equal), and
the presets, links and fitted efficiencies are read from the C++ table both use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from flexnpu.analysis import Device, get_device, link_table, preset_table
from flexnpu.serving.topology import Link as TopologyLink
from flexnpu.sim.models import DEEPSEEK_R1, ModelShape
from flexnpu.sim.steptime import CostModel, EngineShapes, step_features

DATA_DIR = Path(__file__).parent / "data"
CPU_CALIBRATION = DATA_DIR / "cpu_calibration.json"
# Another calibration file for the cpu preset (bench/sim_validate.py points it at the one
# measured in the same window as its serve runs).
CPU_CALIBRATION_ENV = "FLEXNPU_SIM_CPU_CALIBRATION"


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # one direction, per device
    latency_s: float
    source: str


# The links and presets are the one table in xla_passes/roofline.cc (flexnpu.analysis), which
# the emulated backend reads too.
LINKS = {
    name: Link(name, d["bytes_per_s"], d["latency_s"], d["source"])
    for name, d in link_table().items()
}


def topology_link(spec: TopologyLink | None, where: str) -> Link:
    """A topology's link (flexnpu.serving.topology) as the simulator's: a name of the link
    table, or measured bandwidth and latency. ValueError names `where` when it is unknown."""
    if spec is None:
        raise ValueError(f"the topology's {where} is unknown: give one (a link name or measured)")
    if spec.measured:
        return Link(
            spec.name or "measured",
            float(spec.bytes_per_s or 0.0),
            float(spec.latency_s or 0.0),
            spec.source or "measured",
        )
    if spec.name not in LINKS:
        raise ValueError(f"{where}: unknown link {spec.name!r} (known: {', '.join(LINKS)})")
    return LINKS[spec.name]


@dataclass(frozen=True)
class ServingRuntime:
    """How the serving runtime on a preset shapes its steps. The accelerator presets model a
    continuous-batching runtime with kernels sized to the batch (one step in flight per
    decode instance); the cpu preset is this machine running FlexNPU's own engine."""

    # Steps run the engine's padded programs (steptime.EngineShapes), not the real batch.
    padded_programs: bool = False
    # Prompt chunks per step (0: no cap). FlexNPU's runner takes one.
    max_prefill_seqs: int = 0
    # Steps every instance keeps dispatched (0: the simulator's defaults). FlexNPU's engine
    # dispatches step k+1 before it waits for step k (JAX async dispatch), so a request that
    # arrives while step k+1 runs is first planned into step k+2. That holds over jaxlib's
    # CPU client (an execute returns before the computation ends); where an execute returns
    # only when the computation has finished, the overlap is lost and each step's tokens
    # reach the client after the next step: not modelled here.
    inflight: int = 0
    # The padded programs cost what the engine's own step programs cost on the preset, analysed
    # as the emulated backend costs them (sim/engine_programs.py), instead of the CostModel's
    # reference layers with the preset's efficiencies fitted to them (the cpu preset's
    # calibration is fitted to CostModel features).
    analysed_programs: bool = False


FLEXNPU_ENGINE = ServingRuntime(padded_programs=True, max_prefill_seqs=1, inflight=2)
# get_preset's runtime: the preset's own, or FlexNPU's engine on it (emulated devices).
RUNTIMES = ("preset", "flexnpu")


@dataclass(frozen=True)
class Preset:
    name: str
    device: Device  # roofline (flexnpu.analysis preset)
    memory_bytes: float
    link: str
    eff_compute: float = 1.0
    eff_memory: float = 1.0
    fused_attention: bool = True  # accelerators keep attention scores on chip
    efficiency_source: str = "uncalibrated (roofline)"
    runtime: ServingRuntime = ServingRuntime()
    launch_s: float | None = None  # fixed time per step; None: the roofline's small_work_s


_PRESET_DEVICE = {
    "910b": "ascend910b",
    "910c": "ascend910c",
    "h100": "h100",
    "h200": "h200",
    "a100": "a100",
    "cpu": "cpu",
}
PRESETS = tuple(_PRESET_DEVICE)

# CloudMatrix-Infer (arXiv 2506.12708), DeepSeek-R1 on Ascend 910C: prefill 6,688 tokens/s per
# NPU, decode 1,943 tokens/s per NPU at TPOT < 50 ms. Operating points assumed for the fit (the
# paper's setting as we read it): 4K-token prompts; decode batch 96 per NPU at 4K context.
CLOUDMATRIX_PREFILL_TOK_S = 6688.0
CLOUDMATRIX_DECODE_TOK_S = 1943.0
CLOUDMATRIX_PROMPT = 4096
CLOUDMATRIX_DECODE_BATCH = 96
CLOUDMATRIX_DECODE_CTX = 4096


# Vidur (microsoft/vidur, data/profiling/compute/<gpu>/meta-llama/Llama-2-7b-hf/mlp.csv):
# measured medians of every non-attention operator of Llama-2-7B (embedding, norms, QKV/output
# projections, RoPE, gated MLP, adds; tensor parallel 1), summed over the 32 layers, for a step
# of 1 token (weight-read bound) and of 2048 tokens (compute bound). Efficiency = the roofline
# time of those operators (their weights in bf16; 2 FLOPs per weight per token) / measured.
# (The same profiles of Meta-Llama-3-8B on A100 give 0.70 / 0.67: the fit is not model-bound.)
VIDUR_LLAMA2_7B_STEP_MS = {"a100": (9.347, 134.519), "h100": (5.634, 41.051)}
_LLAMA2_7B_LINEAR_PARAMS = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)


def fit_vidur(dev: Device, gpu: str) -> tuple[float, float]:
    """Compute and memory efficiency of an NVIDIA GPU from Vidur's Llama-2-7B profiles."""
    t_one, t_many = (t / 1e3 for t in VIDUR_LLAMA2_7B_STEP_MS[gpu])
    eff_m = 2 * _LLAMA2_7B_LINEAR_PARAMS / dev.mem_bandwidth / t_one
    eff_c = 2 * _LLAMA2_7B_LINEAR_PARAMS * 2048 / dev.peak_flops / t_many
    return float(min(eff_c, 1.0)), float(min(eff_m, 1.0))


@lru_cache(maxsize=4)
def fit_cloudmatrix(dev: Device) -> tuple[float, float]:
    """Compute and memory efficiency of a 910C from CloudMatrix-Infer's per-NPU figures."""
    cm = CostModel.load(DEEPSEEK_R1)
    g = 16  # per-NPU figures: the group size cancels; 16 keeps the batch realistic
    pre = step_features(DEEPSEEK_R1, [(0, CLOUDMATRIX_PROMPT, True)] * 4)
    f, _ = cm.flops_bytes(pre, fused_attention=True)
    target = 4 * CLOUDMATRIX_PROMPT / (CLOUDMATRIX_PREFILL_TOK_S * g)
    eff_c = f / (dev.peak_flops * g) / target
    b_dec = CLOUDMATRIX_DECODE_BATCH * g
    dec = step_features(DEEPSEEK_R1, [(CLOUDMATRIX_DECODE_CTX, 1, True)] * b_dec)
    f, b = cm.flops_bytes(dec, fused_attention=True)
    target = b_dec / (CLOUDMATRIX_DECODE_TOK_S * g)
    # Decode is bandwidth-bound at this point unless compute at eff_c is slower.
    t_c = f / (dev.peak_flops * g * eff_c)
    eff_m = b / (dev.mem_bandwidth * g) / max(target - 0.0, 1e-9)
    if t_c > target:
        eff_m = 1.0  # compute-bound: the compute fit dominates
    return float(min(eff_c, 1.0)), float(min(eff_m, 1.0))


def get_preset(name: str, runtime: str = "preset") -> Preset:
    """A preset; runtime "flexnpu": FlexNPU's own engine serves on it (the cpu preset's
    runtime), as it does on emulated devices of the preset (FLEXNPU_BACKEND=emulate:<name>)."""
    key = name.lower().replace("ascend", "").replace("-", "").replace("_", "")
    if key not in _PRESET_DEVICE:
        raise ValueError(f"unknown device {name!r} (known: {', '.join(PRESETS)})")
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
    row = preset_table()[_PRESET_DEVICE[key]]
    p = Preset(
        key,
        get_device(_PRESET_DEVICE[key]),
        row["memory_bytes"],
        row["link"],
        eff_compute=row["eff_compute"],
        eff_memory=row["eff_memory"],
        efficiency_source=row["efficiency_source"],
    )
    if key != "cpu":
        if runtime == "preset":
            return p
        return replace(p, runtime=replace(FLEXNPU_ENGINE, analysed_programs=True))
    # This machine: FlexNPU's own engine, efficiencies from a calibration file.
    p = replace(p, fused_attention=False, runtime=FLEXNPU_ENGINE)
    path = Path(os.environ.get(CPU_CALIBRATION_ENV) or CPU_CALIBRATION)
    if not path.exists():
        if os.environ.get(CPU_CALIBRATION_ENV):
            raise ValueError(f"{CPU_CALIBRATION_ENV}={path}: no such calibration file")
        return p
    c = json.loads(path.read_text())
    return replace(
        p,
        eff_compute=c["eff_compute"],
        eff_memory=c["eff_memory"],
        launch_s=c.get("launch_s"),
        efficiency_source=c["source"],
    )


@dataclass
class StepTimer:
    """Step time of a model on a unit of `parallel` devices of a preset."""

    model: ModelShape
    preset: Preset
    parallel: int
    cost: CostModel
    shapes: EngineShapes | None = None  # the engine's padded programs (runtime.padded_programs)

    @classmethod
    def create(cls, model: ModelShape, preset: Preset, parallel: int, instance=None) -> StepTimer:
        """instance: the instances' InstanceConfig; with a preset whose runtime runs padded
        programs, steps cost what the engine compiles for those settings."""
        shapes = None
        if preset.runtime.padded_programs and instance is not None:
            shapes = EngineShapes.of_engine(
                instance.max_num_seqs,
                instance.max_num_batched_tokens,
                instance.block_size,
                instance.max_model_len,
            )
        timer = cls(model, preset, parallel, CostModel.load(model), shapes)
        if shapes is not None and preset.runtime.analysed_programs:
            if parallel != 1:
                raise ValueError(
                    f"runtime flexnpu runs one engine instance per device (--parallel 1), "
                    f"got --parallel {parallel}"
                )
            from flexnpu.sim.engine_programs import program_costs

            timer._program_cost.update(program_costs(model.name, shapes, preset.device.name))
        return timer

    def __post_init__(self) -> None:
        d = self.preset.device
        g = self.parallel
        self.peak = d.peak_flops * g
        self.bandwidth = d.mem_bandwidth * g
        self.seconds_per_flop = 1.0 / (self.peak * self.preset.eff_compute)
        self.seconds_per_byte = 1.0 / (self.bandwidth * self.preset.eff_memory)
        self.launch_s = d.small_work_s if self.preset.launch_s is None else self.preset.launch_s
        fc = self.cost.flop_coef
        bc = self.cost.byte_coefs(self.preset.fused_attention)  # KV read once when fused
        self._fc, self._bc = fc, bc
        self._fcl = [float(v) for v in fc]
        self._bcl = [float(v) for v in bc]
        self._moe_layers = (
            self.model.num_layers - self.model.num_dense_layers if self.model.is_moe else 0
        )
        self._ridge = self.peak / self.bandwidth
        self._program_cost: dict[tuple[int, int], tuple[float, float]] = {}
        self._experts: dict[int, float] = {}  # tokens -> experts touched x MoE layers

    def program_cost(self, chunk: int, width: int) -> tuple[float, float]:
        """FLOPs and bytes of one of the engine's padded programs (cached: there are few)."""
        key = (chunk, width)
        cost = self._program_cost.get(key)
        if cost is None:
            assert self.shapes is not None
            cost = self.flops_bytes(self.shapes.features(chunk, width))
            self._program_cost[key] = cost
        return cost

    def step_cost(self, scheduled, decodes: int = 0, decode_starts: int = 0) -> tuple[float, float]:
        """FLOPs and bytes of a step straight from the scheduler's entries (the hot path:
        the features of steptime.step_features, summed without building arrays). `decodes`
        more single-token sampling entries whose starts sum to `decode_starts` may be given
        in aggregate (StepPlan.bulk_decodes; not with padded programs)."""
        if self.shapes is not None:
            if decodes:
                raise ValueError("step_cost: padded programs need every entry")
            return self.program_cost(*self.shapes.program(scheduled))
        n, s = decodes, decodes
        a = k = decode_starts + decodes
        for e in scheduled:
            num, st = e.num_tokens, e.start
            n += num
            a += num * st + num * (num + 1) // 2
            k += st + num
            s += e.samples
        x = 0.0
        if self._moe_layers:  # memoised per token count (a float power per step otherwise)
            x = self._experts.get(n)
            if x is None:
                x = self._experts[n] = self.model.experts_touched(n) * self._moe_layers
        f0, f1, f2, f3, f4, f5 = self._fcl
        b0, b1, b2, b3, b4, b5 = self._bcl
        return (
            f0 + f1 * n + f2 * a + f3 * k + f4 * s + f5 * x,
            b0 + b1 * n + b2 * a + b3 * k + b4 * s + b5 * x,
        )

    def features(self, entries) -> np.ndarray:
        return step_features(self.model, entries)

    def flops_bytes(self, feats: np.ndarray) -> tuple[float, float]:
        return float(self._fc @ feats), float(self._bc @ feats)

    def seconds(self, flops: float, nbytes: float) -> float:
        return max(flops * self.seconds_per_flop, nbytes * self.seconds_per_byte) + self.launch_s

    def phase(self, flops: float, nbytes: float) -> str:
        """As flexnpu.analysis classifies on the device: compute-bound -> prefill."""
        if max(flops / self.peak, nbytes / self.bandwidth) < self.launch_s:
            return "small"
        return "prefill" if flops >= nbytes * self._ridge else "decode"

    def prefill_seconds(self, prompt: int) -> float:
        """Queue-free time of one whole-prompt prefill step."""
        return self.seconds(*self.flops_bytes(self.features([(0, prompt, True)])))

    def weight_bytes_per_unit(self) -> float:
        return self.model.weight_bytes
