"""From the compiler's per-device figures to a predicted step time and MFU.

The model, stated so it can be checked:

* **compute** = FLOPs / (bf16 peak x MXU efficiency x alignment), where FLOPs is the larger of the
  compiler's count and the analytical hardware FLOPs (6N + 12LHQT per token, plus what remat recomputes).
  The floor is needed because XLA's cost analysis counts a while-loop body once, and on TPU it turns
  FSDP's gathered matmuls into windowed-einsum loops, which it then undercounts (docs/planner.md,
  "Prediction"). The efficiency is the fraction of peak large, aligned matmuls reach (per
  generation: `CostModel`); alignment is the FLOP-weighted waste of matmul dimensions that are not
  multiples of the MXU width (128; 256 on v6e), per device after sharding: the projections' widths
  and attention's head width (`alignment`);
* **memory** = compiler HBM bytes / the device's HBM bandwidth (half the chip's on TPU7x, as its peak);
* **communication** = each collective's bandwidth-optimal ring cost (see `collectives.py`) over
  the ICI links its device group spans: a group that fits along one torus axis gets that axis's
  share of the chip's ICI bandwidth (ICI / torus dimensions), one spanning k axes k times that;
  a DCN collective (across slices, `collectives.py`) the same ring over its slices at each
  device's share of the host's DCN bandwidth (`Topology.dcn_bytes_per_s_per_device`), added to the
  communication and reported apart (`dcn_seconds`, and `exposed_dcn_seconds`: the step time it adds,
  with each latency-bound step of a DCN collective (`collectives.latency_steps`) at the fitted
  `CostModel.dcn_step_seconds`, serial with the busy time);
* **overlap**: matmuls and memory-bound work (norms, softmax, elementwise, optimizer) overlap
  only in part: `memory_overlap` of the shorter one hides under the longer; XLA's async
  collectives hide communication behind that busy time up to `overlap` of it.

* **a chip's own figures** (attention_kernel.py), on a slice the size of the chip's measured steps
  (one chip): global causal attention costs the flash kernel's timed seconds (forward, the
  recomputed forward, backward, at the step's block size and head width) in place of its FLOPs,
  serial with the rest, and the matmul efficiency and the weight of remat's recomputed FLOPs are
  the chip's, fitted to its steps.

* **the host link** (`CostModel.host_link_gbytes_per_s`): offloaded tensors cross the chip's host
  link while the step computes, so the step is no shorter than that traffic's time (a roofline, at
  the fastest host rate a calibration row sustained: calibration/host_link.py).

busy = max(compute, memory) + (1 - memory_overlap) x min(compute, memory) (+ the timed kernel);
step = max(busy + max(0, communication - overlap x busy), host traffic / host link).
Predicted MFU = model FLOPs per device (the profiler's formula and attention convention) / step /
per-device peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpu_tuner.metrics.mfu import mfu
from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.planner.compiler.compiled_step import CompiledStep
from tpu_tuner.planner.prediction.attention_kernel import AttentionKernelWork, ChipStep
from tpu_tuner.planner.prediction.band import BandRow, ErrorBand, Place
from tpu_tuner.planner.prediction.collectives import latency_steps, ring_seconds
from tpu_tuner.planner.prediction.efficiency_prior import efficiency_prior
from tpu_tuner.planner.prediction.novelty import band_far
from tpu_tuner.planner.topology import Topology

# The MXU's width where it is not 128 (v6e's 256x256 systolic arrays; TPU7x's was not verifiable).
MXU_WIDTH = {"v6e": 256}
# ICI per chip where Google does not state it (v4): assumed equal to v5p's, and said so.
ICI_FALLBACK_GBYTES = 1200.0
# The 8-bit matmuls' peak per chip (TOP/s, TFLOP/s), only where Google Cloud states it: int8 on v5e
# (393) and v6e (1836) in https://cloud.google.com/tpu/docs/v6e's table; fp8 on TPU7x (4614) in
# https://cloud.google.com/tpu/docs/tpu7x, whose table gives v5p and v6e an fp8 peak equal to their
# bf16 one (no fp8 units). v4, v5p and TPU7x state no int8 peak: int8 there is refused, not guessed.
QUANTIZED_PEAK_TFLOPS = {"int8": {"v5e": 393.0, "v6e": 1836.0}, "fp8": {"tpu7x": 4614.0}}


def quantized_peak_refusal(generation: str, quantization: str) -> str | None:
    """Why `quantization` cannot be planned on `generation` (None: it can)."""
    peaks = QUANTIZED_PEAK_TFLOPS.get(quantization)
    if peaks is None:
        return f"unknown quantization {quantization!r}: int8 or fp8"
    if generation in peaks:
        return None
    if quantization == "fp8":
        return (
            f"{generation} has no fp8 matmul units (Google states an fp8 peak above bf16 only for TPU7x: "
            "cloud.google.com/tpu/docs/tpu7x)"
        )
    return (
        f"Google states no int8 peak for {generation} (int8 peaks are stated for "
        f"{', '.join(sorted(peaks))}); plan it without --quantization"
        + (" or with fp8" if generation == "tpu7x" else "")
    )


@dataclass(frozen=True)
class CostModel:
    """The physical constants of the prediction and their error.

    The planner's are fitted to published TPU training runs (MaxText's and tpu-recipes'
    configurations, docs/planner.md "Calibration"; planner/calibration/fitting.py, from the compiler
    figures benchmarks/planner/plan_calibration.py keeps in calibration_rows.json):
    an MXU efficiency per generation (for a generation without rows, the line of the others' in the
    log of their bf16 peaks: efficiency_prior.py; `mxu_efficiency` where none can be drawn) and one
    compute / memory overlap; `overlap` (communication hidden behind busy time) is fixed, not
    fitted. A dropless MoE step has its own efficiency per generation ("tpu7x/dropless" in
    `efficiency_by_generation`; elsewhere the generation's x `dropless_ratio`). Each row's
    leave-one-out error (its miss when the constants are fitted to the other rows) is kept with
    where the row sits (`band_rows`): the band of every prediction (band.py)."""

    mxu_efficiency: float = 0.78
    memory_overlap: float = 0.66
    overlap: float = 0.9
    efficiency_by_generation: tuple[tuple[str, float], ...] = ()
    # The cause terms (docs/planner.md, "Calibration"; 0: off): host-offload traffic at this
    # bandwidth per chip (a TPU7x chip's two devices share it), serial with the busy time; each
    # causal attention score element costs
    # this many MXU FLOPs of vector-unit work (softmax: exp, max, scale, in the forward pass and
    # again in the backward), added to the compute.
    host_gbytes_per_s: float = 0.0
    score_flops: float = 0.0
    # The share of the collectives' ring time never hidden behind compute (latency, the FSDP
    # gathers at each block's start, synchronisation): serial with the busy time. 0: off.
    comm_exposed: float = 0.0
    # Seconds one latency-bound step of a DCN collective costs, serial with the busy time (a
    # transfer across slices goes through the hosts; fitted to the multi-slice rows). 0: off.
    dcn_step_seconds: float = 0.0
    # A dropless MoE step's efficiency over the dense one's, for a generation without dropless rows
    # (the median over the generations with both: calibration.Fitted).
    dropless_ratio: float = 1.0
    # HBM passes over a dropless step's routed tokens (`routed_seconds`: the sort's gathers and
    # scatters), serial with the busy time; fitted to the dropless rows. With it a dropless step
    # runs its matmuls at its generation's dense efficiency. 0: off.
    route_passes: float = 0.0
    # A chip's host link (GB/s, both directions), as a roofline under the step: the fastest host
    # rate a calibration row sustained (calibration/host_link.py). 0: off.
    host_link_gbytes_per_s: float = 0.0
    loo_error_points: float = 0.0  # the mean absolute leave-one-out error, MFU points
    band_rows: tuple[BandRow, ...] = ()
    noise_floor_points: float = 0.0  # the narrowest band: re-measured published recipes' spread
    fitted_rows: int = 0
    # The band's widening a unit of distance from the point's generation's rows (novelty.py:
    # few rows, a larger slice, a remat family or layout kind not calibrated there). 0: none.
    band_widening: float = 0.0

    def efficiency(self, generation: str, moe: str = "dense") -> float:
        """The fraction of peak that large aligned matmuls reach on `generation` in a step whose
        MoE routing is `moe` ("dense", "dropping" or "dropless": grouped matmuls and sorts)."""
        by = dict(self.efficiency_by_generation)
        dense = by.get(generation)
        if dense is None:  # no calibration row on it: the line in its published peak (efficiency_prior.py)
            prior = efficiency_prior({g: e for g, e in by.items() if "/" not in g}, generation)
            dense = self.mxu_efficiency if prior is None else prior
        if moe == "dropless" and not self.route_passes:
            own = by.get(f"{generation}/dropless")
            return own if own is not None else dense * self.dropless_ratio
        return dense


def error_band(place: Place, cost_model: CostModel) -> ErrorBand | None:
    """The band printed with a prediction at `place` (band.py); None for an uncalibrated cost model."""
    if not cost_model.fitted_rows:
        return None
    return band_far(place, list(cost_model.band_rows), cost_model.noise_floor_points, cost_model.band_widening)


@dataclass(frozen=True)
class Prediction:
    compute_seconds: float
    memory_seconds: float
    comm_seconds: float
    exposed_comm_seconds: float
    step_seconds: float
    alignment: float
    mfu: float
    tokens_per_second: float
    dcn_seconds: float = 0.0  # the DCN collectives' ring time (multi-slice); comm_seconds is ICI's
    exposed_dcn_seconds: float = 0.0  # what the DCN collectives add to the step
    attention_kernel_seconds: float = 0.0  # flash attention as a chip timed it (in compute_seconds)
    host_link_seconds: float = 0.0  # the offloaded tensors' time on the host link (a floor under the step)


def ring_bandwidth(topology: Topology, group_devices: int) -> float:
    """Bytes/s a ring over `group_devices` devices gets from the ICI torus."""
    ici = (topology.chip.ici_gbytes_per_s or ICI_FALLBACK_GBYTES) * 1e9
    per_axis = ici / topology.chip.torus_dims
    chips = max(1, math.ceil(group_devices / topology.devices_per_chip))
    spanned, capacity = 0, 1
    for side in sorted(topology.shape, reverse=True):
        if capacity >= chips:
            break
        capacity *= side
        spanned += 1
    if chips == 1 and group_devices > 1:
        # Both devices of a TPU7x chip: on-chip, far faster than ICI; counted as one axis.
        spanned = 1
    return per_axis * max(spanned, 1)


def alignment(shape: ModelShape, layout: Layout, head_dim: int, mxu: int, seq_len: int = 0) -> float:
    """FLOP-weighted fraction of MXU work that is useful for the model's per-device matmuls.

    With `seq_len`, attention's own matmuls count too: QK^T contracts over the head width and PV
    produces it, so a head narrower than the MXU (64 on v5e's 128) leaves lanes idle in both, which
    the projections' widths do not show (a v5e chip ran 64-wide heads 42% slower than 128-wide at
    the same FLOPs: docs/planner.md, "On a real chip"). Weighted as the prediction counts their
    FLOPs: full attention, 12 x seq x heads x head_dim a token a layer, i.e. 2 x seq x heads x
    head_dim against the projections' weights (6 FLOPs a weight a token)."""

    def useful(n: int) -> float:
        return n / (math.ceil(n / mxu) * mxu) if n > 0 else 1.0

    t = layout.tensor
    terms = [  # (flops weight, per-device matmul width, contraction width)
        (3 * shape.d_model * shape.mlp_hidden, shape.mlp_hidden // t, shape.d_model),
        (2 * shape.d_model * shape.n_heads * head_dim, shape.n_heads * head_dim // t, shape.d_model),
        (2 * shape.d_model * shape.n_kv_heads * head_dim, shape.n_kv_heads * head_dim // t, shape.d_model),
        (shape.d_model * shape.vocab / max(shape.n_layers, 1), shape.vocab // t, shape.d_model),
    ]
    if seq_len:
        # QK^T ([seq, head_dim] x [head_dim, seq]) wastes on its contraction, PV on its output
        # width: each the head width once, the sequence sides taken as filling the MXU.
        terms.append((2 * seq_len * shape.n_heads * head_dim, head_dim, mxu))
    total = sum(w for w, _, _ in terms)
    return sum(w * useful(contraction) * useful(width) for w, width, contraction in terms) / total


def causal_score_elements(layers: int, heads: int, seq_len: int, tokens_per_device: float) -> float:
    """Causal attention's score elements per device a step (the flash kernel skips the masked
    half): what the "+attention" cause term charges `CostModel.score_flops` for, each."""
    return layers * heads * seq_len * tokens_per_device / 2


def routed_seconds(tokens_per_device: float, routed_per_token: float, hbm_bytes_per_s: float) -> float:
    """One HBM pass over a dropless MoE step's routed tokens: each token's top_k copies of its
    d_model bf16 activations in each routed layer (`routed_per_token`: top_k x d_model summed over
    those layers), at the device's HBM bandwidth. The "+route"
    term charges a fitted number of such passes (docs/planner.md, issue 70: the sort's gathers and
    scatters, which a v5e chip ran at a sixth of the HBM bandwidth)."""
    return tokens_per_device * routed_per_token * 2 / hbm_bytes_per_s


def predict(
    compiled: CompiledStep,
    topology: Topology,
    layout: Layout,
    shape: ModelShape,
    head_dim: int,
    model_flops_per_device: float,
    tokens_per_step: int,
    cost_model: CostModel,
    hardware_flops_per_device: float = 0.0,
    seq_len: int = 0,
    quantization: str | None = None,
    quantized_share: float = 0.0,
    moe: str = "dense",
    routed_per_token: float = 0.0,
    kernel: AttentionKernelWork | None = None,
    chip: ChipStep | None = None,
) -> Prediction:
    """The step's time, MFU and tokens/s. With `quantization`, `quantized_share` of the FLOPs (the
    blocks' linear layers) run at the generation's 8-bit peak, the rest at bf16's, each at the
    fitted efficiency; MFU stays against the bf16 peak (MaxText's convention). `moe`: the step's
    MoE routing (a dropless step runs at its own fitted efficiency: `CostModel.efficiency`; or,
    with `CostModel.route_passes`, at the dense one plus that many passes over its routed tokens,
    `routed_per_token` of them: experts.routed_per_token).
    `kernel`: the step's flash attention as a chip timed it (attention_kernel.py): its seconds
    run serial with the rest of the busy time, and its FLOPs and bytes leave the matmul work.
    `chip`: the step as one chip of the generation measured it: its matmul efficiency, and the
    point's recomputed FLOPs weighed at the share the chip's steps showed."""
    peak = topology.peak_flops_per_device
    mxu = MXU_WIDTH.get(topology.chip.generation, 128)
    if kernel is None:
        aligned = alignment(shape, layout, head_dim, mxu, seq_len)
        flops = max(compiled.flops, hardware_flops_per_device)
        scores = causal_score_elements(shape.n_layers, shape.n_heads, seq_len, tokens_per_step / topology.devices)
        bytes_accessed = compiled.bytes_accessed
    else:  # the timings hold the head width's waste and the softmax's vector work
        aligned = alignment(shape, layout, head_dim, mxu)
        flops = max(compiled.flops - kernel.counted_flops, hardware_flops_per_device - kernel.hardware_flops)
        scores = 0.0
        bytes_accessed = max(0.0, compiled.bytes_accessed - kernel.counted_bytes)
    # Seconds a FLOP at full efficiency: 8-bit matmuls at their own peak (docs/planner.md, "Precision of the step").
    per_flop = 1 / peak
    if quantization is not None and quantized_share:
        quantized_peak = (
            QUANTIZED_PEAK_TFLOPS[quantization][topology.chip.generation] * 1e12 / topology.devices_per_chip
        )
        per_flop = (1 - quantized_share) / peak + quantized_share / quantized_peak
    at_peak = flops / aligned * per_flop + cost_model.score_flops * scores / peak
    if chip is not None:
        at_peak -= (1 - chip.recompute_weight) * chip.recomputed_flops / aligned * per_flop
    efficiency = chip.efficiency if chip is not None else cost_model.efficiency(topology.chip.generation, moe)
    compute = at_peak / efficiency
    memory = bytes_accessed / topology.hbm_bytes_per_s_per_device
    comm = sum(
        ring_seconds(c, ring_bandwidth(topology, c.group_size)) for c in compiled.collectives if c.network != "dcn"
    )
    across_slices = [c for c in compiled.collectives if c.network == "dcn"]
    dcn = sum(ring_seconds(c, topology.dcn_bytes_per_s_per_device) for c in across_slices)
    dcn_latency = cost_model.dcn_step_seconds * sum(latency_steps(c) for c in across_slices)
    work = max(compute, memory) + (1 - cost_model.memory_overlap) * min(compute, memory)
    if kernel is not None:
        work += kernel.seconds
    # Offloaded tensors go to the host in the forward pass and come back in the backward, over the
    # chip's host link, which a TPU7x chip's two devices share.
    host_bytes_per_chip = 2 * compiled.host_temp_bytes * topology.devices_per_chip
    if cost_model.host_gbytes_per_s:
        work += host_bytes_per_chip / (cost_model.host_gbytes_per_s * 1e9)
    link = host_bytes_per_chip / (cost_model.host_link_gbytes_per_s * 1e9) if cost_model.host_link_gbytes_per_s else 0.0
    if moe == "dropless" and cost_model.route_passes:
        tokens = tokens_per_step / topology.devices
        work += cost_model.route_passes * routed_seconds(tokens, routed_per_token, topology.hbm_bytes_per_s_per_device)

    def step_of(communication: float, latency: float = 0.0) -> tuple[float, float, float]:
        """(step, exposed communication, never hidden) with `communication` seconds of collectives
        and `latency` seconds of DCN steps."""
        never_hidden = cost_model.comm_exposed * communication
        busy = work + never_hidden + latency
        exposed = max(0.0, communication - cost_model.overlap * busy)
        return max(busy + exposed, link), exposed, never_hidden + latency

    step, exposed, never_hidden = step_of(comm + dcn, dcn_latency)
    return Prediction(
        compute_seconds=compute + (kernel.seconds if kernel else 0.0),
        memory_seconds=memory,
        comm_seconds=comm,
        exposed_comm_seconds=exposed + never_hidden,
        step_seconds=step,
        alignment=aligned,
        mfu=mfu(model_flops_per_device, step, peak),
        tokens_per_second=tokens_per_step / step,
        dcn_seconds=dcn,
        exposed_dcn_seconds=step - step_of(comm)[0] if across_slices else 0.0,
        attention_kernel_seconds=kernel.seconds if kernel else 0.0,
        host_link_seconds=link,
    )
