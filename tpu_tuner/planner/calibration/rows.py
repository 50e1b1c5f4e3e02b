"""A calibration row: one published run reduced to what the prediction needs (fitting.py fits the
constants to them; benchmarks/planner/plan_calibration.py writes them)."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tuner.planner.prediction.band import BandRow, Place


@dataclass(frozen=True)
class CalibrationRow:
    """One published run as the prediction sees it (seconds per step, per device)."""

    number: int
    generation: str
    fits: bool
    peak_bytes: float
    hbm_bytes: float
    compute_at_full_efficiency: float
    memory_seconds: float
    comm_seconds: float
    model_seconds_at_peak: float
    published_mfu: float
    # Where the row sits (the band's distance, band.py): its published run, the remat policy's
    # family (full / minimal / offload / device), sequence length and per-device batch.
    id: str = ""
    remat_family: str = ""
    seq: int = 0
    per_device_batch: float = 0.0
    # The cause terms' inputs (predict.py): host-offload traffic per chip a step (GB: the compiler's
    # host buffers written in the forward pass and read back in the backward, times the devices
    # that share the chip's host link), and the attention score
    # elements per device per step divided by the per-device peak (seconds at one MXU FLOP each).
    host_gbytes: float = 0.0
    score_seconds: float = 0.0
    # Latency-bound steps of the DCN collectives a step (collectives.latency_steps, summed): what
    # the "+dcn" term charges its fitted seconds for, each.
    dcn_steps: float = 0.0
    # More of where the row sits, for the band's likeness (band.py): its MoE kind ("dense",
    # "dropping": a capacity factor, "dropless") and the slices its run joined over DCN.
    moe: str = "dense"
    slices: int = 1
    # What the row is grouped by when whole groups are left out (group_check.py) and how far a
    # prediction is from it (band.py's distance): the published table or log it comes from, its
    # model family, the chips of one of its slices and its layout's kind (novelty.layout_kind).
    source: str = ""
    family: str = ""
    chips: int = 0
    layout: str = ""
    # A dropless MoE step's routed activations read once at HBM bandwidth (tokens per device x
    # top_k x d_model x 2 bytes x MoE layers / the device's HBM bandwidth): what the "+route" term
    # charges its fitted passes for, each (the token sort's gathers and scatters); 0 elsewhere.
    route_seconds: float = 0.0


DROPLESS = "dropless"


def fit_group(generation: str, moe: str, apart: bool = True) -> str:
    """The efficiency a row is fitted with: its generation's, or for a dropless MoE step its
    generation's dropless one ("tpu7x/dropless"): the grouped matmuls (megablox, tokamax), the
    token sort's gathers and the expert weights' gathers run well below the dense matmuls' share
    of peak, by how much depending on the chip's kernel (docs/planner.md, "Calibration"). Not
    `apart` (the "+route" term charges the routing instead): the generation's."""
    return f"{generation}/{DROPLESS}" if moe == DROPLESS and apart else generation


def place_of(row: CalibrationRow) -> Place:
    """Where a row sits, as the band compares places (offload: the row moved bytes to the host)."""
    return Place(
        row.generation,
        row.remat_family,
        row.seq,
        row.per_device_batch,
        moe=row.moe,
        offload=row.host_gbytes > 0,
        slices=row.slices,
        chips=row.chips or None,
        layout=row.layout or None,
    )


def band_row(row: CalibrationRow, error: float, unseen: float | None, group: float | None = None) -> BandRow:
    """A row's place with its leave-one-out error, its error with its generation unseen and its
    error with its source or model family left out (None: not measured)."""
    return BandRow(**vars(place_of(row)), error=error, unseen_generation_error=unseen, group_error=group)
