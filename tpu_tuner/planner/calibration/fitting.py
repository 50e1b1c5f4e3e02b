"""Fitting the prediction's constants to published runs, and its leave-one-out error.

A calibration row is one published run reduced to what the prediction needs (predict.py): the
compute time at full MXU efficiency, the memory and communication times, and the model FLOPs'
time at peak (MFU x step). Predicted MFU is then a function of the constants alone, so fits and
leave-one-out errors need no compiles (benchmarks/planner/plan_calibration.py compiles the rows once).

Efficiency models compared (EFFICIENCY_MODELS):

* ``global``: one MXU efficiency for every generation, and one compute / memory overlap;
* ``per_generation``: an efficiency per generation, the overlap shared; a generation with no
  other row is predicted with the line of the other generations' efficiencies in the log of
  their bf16 peaks, at its own (efficiency_prior.py; the median chip's where no line exists), so its
  leave-one-out error is that of a generation the fit never saw). Dropless MoE steps have their
  own efficiency per generation (`DROPLESS`: grouped-matmul kernels and token sorts, not the dense
  matmuls; a generation without such rows takes its dense efficiency x the median ratio of the
  generations that have both);
* ``mxu_shape``: physics instead of per-generation freedom: efficiency = base for a 128-wide MXU,
  x `wide_mxu` for a 256-wide one (v6e: predict.MXU_WIDTH), whose systolic array takes four
  times the operands per cycle from the same VMEM, so it is harder to keep busy.

A ``+term`` adds a cause term with one constant shared by every row (CostModel says what each
charges): ``host`` (offload bandwidth), ``attention`` (vector work a score element), ``comm``
(a share of the collectives never hidden), ``dcn`` (the latency of one step of a DCN collective),
``route`` (HBM passes over a dropless step's routed tokens; its matmuls then at the dense efficiency),
``link`` (the host link as a roofline: a step is no shorter than its offload traffic at the fastest
host rate a fitted row sustained, host_link.py; no constant searched).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from tpu_tuner.metrics.mfu import share_of_peak
from tpu_tuner.planner.calibration.host_link import host_link_bound
from tpu_tuner.planner.calibration.rows import DROPLESS, CalibrationRow, band_row, fit_group, place_of
from tpu_tuner.planner.prediction.band import BandRow, ErrorBand, conformal_quantile
from tpu_tuner.planner.prediction.efficiency_prior import efficiency_prior
from tpu_tuner.planner.prediction.novelty import band_far
from tpu_tuner.planner.prediction.predict import MXU_WIDTH

log = logging.getLogger(__name__)

# The calibration rows' compiler figures, as benchmarks/planner/plan_calibration.py measured and wrote them.
ROWS_FILE = Path(__file__).with_name("calibration_rows.json")
# Published recipes measured twice (a superseded figure and the current one), MFU points apart.
RERUNS_FILE = Path(__file__).with_name("calibration_reruns.json")
# The model the planner predicts with (docs/planner.md, "Calibration" and "an eighth session", say why).
ADOPTED = "per_generation+dcn+route+link"

EFFICIENCY_MODELS = (
    "global",
    "per_generation",
    "mxu_shape",
    "per_generation+host",
    "per_generation+attention",
    "per_generation+comm",
    "per_generation+host+comm",
    "per_generation+host+attention",
    "per_generation+dcn",
    "per_generation+host+dcn",
    "per_generation+dcn+route",
    "per_generation+dcn+route+link",
)
WIDE_MXU = tuple(g for g, width in MXU_WIDTH.items() if width > 128)  # the prediction's own table
OVERLAP = 0.9  # communication hidden behind busy time (fixed, not fitted: predict.CostModel)
_EFFICIENCIES = [e / 100 for e in range(20, 101)]  # from 0.2: the TPU7x dropless MoE steps fit 0.40
TERMS = ("host", "attention", "comm", "dcn", "route", "link")  # the cause terms a kind may add
_MEMORY_OVERLAPS = [g / 100 for g in range(0, 101, 2)]


@dataclass(frozen=True)
class Fitted:
    kind: str
    efficiency: dict[str, float]  # fit group (`fit_group`) -> MXU efficiency ("*": a generation without rows)
    memory_overlap: float
    host_gbytes_per_s: float = 0.0  # the "+host" term's bandwidth (0: no term)
    score_flops: float = 0.0  # the "+attention" term's cost of a score element, in MXU FLOPs (0: none)
    comm_exposed: float = 0.0  # the "+comm" term: this share of the collectives' time never hidden (0: none)
    dcn_step_seconds: float = 0.0  # the "+dcn" term: seconds a latency-bound DCN step (0: none)
    dropless_ratio: float = (
        1.0  # a dropless step's efficiency / the dense one, where its generation has no dropless row
    )
    route_passes: float = 0.0  # the "+route" term: HBM passes over a dropless step's routed tokens (0: none)
    host_link_gbytes_per_s: float = 0.0  # the "+link" roofline: a chip's host link, GB/s (0: none)

    @property
    def dropless_apart(self) -> bool:
        """Whether dropless steps have their own efficiency (else the "+route" term charges them)."""
        return "route" not in self.kind.split("+")

    def efficiency_of(self, generation: str, moe: str = "dense") -> float:
        """The efficiency a step of `generation` and MoE kind `moe` is predicted with."""
        own = self.efficiency.get(fit_group(generation, moe, self.dropless_apart))
        if own is not None:
            return own
        dense = self.efficiency.get(generation)
        if dense is None:  # a generation without rows: the line in its published peak, else the median chip's
            known = {g: e for g, e in self.efficiency.items() if "/" not in g and g != "*"}
            prior = efficiency_prior(known, generation)
            dense = self.efficiency["*"] if prior is None else prior
        return dense * self.dropless_ratio if moe == DROPLESS and self.dropless_apart else dense

    def describe(self) -> str:
        effs = ", ".join(f"{g} {e:.2f}" for g, e in sorted(self.efficiency.items()))
        terms = (
            (f"; host offload at {self.host_gbytes_per_s:g} GB/s" if self.host_gbytes_per_s else "")
            + (f"; {self.score_flops:g} MXU FLOPs per attention score element" if self.score_flops else "")
            + (f"; {self.comm_exposed:g} x the collectives' time exposed" if self.comm_exposed else "")
            + (f"; {self.dcn_step_seconds * 1e3:.2f} ms a DCN step" if self.dcn_step_seconds else "")
            + (f"; {self.route_passes:g} HBM passes over the routed tokens" if self.route_passes else "")
            + (f"; host link {self.host_link_gbytes_per_s:.1f} GB/s a chip" if self.host_link_gbytes_per_s else "")
        )
        return f"MXU efficiency {effs}; memory overlap {self.memory_overlap:.2f}{terms}"


def predicted_mfu(
    row: CalibrationRow,
    efficiency: float,
    memory_overlap: float,
    host_gbytes_per_s: float = 0.0,
    score_flops: float = 0.0,
    comm_exposed: float = 0.0,
    dcn_step_seconds: float = 0.0,
    route_passes: float = 0.0,
) -> float:
    """predict.py's MFU for the row's figures and these constants."""
    fitted = Fitted(
        "", {"*": efficiency}, memory_overlap, host_gbytes_per_s, score_flops, comm_exposed, dcn_step_seconds
    )
    fitted = replace(fitted, route_passes=route_passes)
    return float(_predictions([row], fitted)[0])


def _arrays(rows: list[CalibrationRow]) -> dict[str, np.ndarray]:
    return {
        name: np.asarray([getattr(r, attr) for r in rows], dtype=float)
        for name, attr in (
            ("compute", "compute_at_full_efficiency"),
            ("memory", "memory_seconds"),
            ("comm", "comm_seconds"),
            ("model", "model_seconds_at_peak"),
            ("published", "published_mfu"),
            ("host", "host_gbytes"),
            ("score", "score_seconds"),
            ("dcn_steps", "dcn_steps"),
            ("route", "route_seconds"),
        )
    }


def _with_terms(a: dict[str, np.ndarray], terms: Fitted) -> dict[str, np.ndarray]:
    """The rows' arrays with the cause terms' seconds (`terms`' constants): attention's vector work
    added to compute (at full efficiency: it is divided by the efficiency with the rest); host
    traffic, the collectives' exposed share and the DCN steps' latency apart (serial with the busy
    time)."""
    extra_compute = terms.score_flops * a["score"]
    host = a["host"] / terms.host_gbytes_per_s if terms.host_gbytes_per_s else np.zeros_like(a["host"])
    serial = host + terms.comm_exposed * a["comm"] + terms.dcn_step_seconds * a["dcn_steps"]
    serial = serial + terms.route_passes * a["route"]
    return {**a, "compute": a["compute"] + extra_compute, "host_seconds": serial, **link_seconds(a, terms)}


def link_seconds(a: dict[str, np.ndarray], terms: Fitted) -> dict[str, np.ndarray]:
    """The host link's time a step (the rows' host traffic at `terms`' link bandwidth), keyed
    "link" for `_predicted`'s roofline; nothing without the "+link" term."""
    return {"link": a["host"] / terms.host_link_gbytes_per_s} if terms.host_link_gbytes_per_s else {}


def _predicted(a: dict[str, np.ndarray], efficiency: np.ndarray, memory_overlap: np.ndarray) -> np.ndarray:
    """Predicted MFU, broadcast over the constants' arrays (rows on the last axis): predict.py's step."""
    compute = a["compute"] / efficiency
    busy = np.maximum(compute, a["memory"]) + (1 - memory_overlap) * np.minimum(compute, a["memory"])
    busy = busy + a.get("host_seconds", 0.0)  # host DMA beside HBM traffic: serial (predict.py says why)
    step = busy + np.maximum(0.0, a["comm"] - OVERLAP * busy)
    return share_of_peak(a["model"], np.maximum(step, a.get("link", 0.0)))  # the host link's roofline


def _predictions(rows: list[CalibrationRow], fitted: Fitted) -> np.ndarray:
    """Every row's predicted MFU with `fitted`'s constants, at once."""
    a = _with_terms(_arrays(rows), fitted)
    efficiency = np.asarray([fitted.efficiency_of(r.generation, r.moe) for r in rows])
    return _predicted(a, efficiency, np.asarray(fitted.memory_overlap))


def errors(rows: list[CalibrationRow], fitted: Fitted) -> list[float]:
    """Predicted minus published MFU, in points, per row (all rows at once: the fits call it for
    every point of their grids)."""
    published = np.asarray([r.published_mfu for r in rows])
    return [float(e) for e in (_predictions(rows, fitted) - published) * 100]


# The cause terms' grids (docs/planner.md, "Calibration"): host-offload bandwidth per chip in GB/s,
# and an attention score element's cost in MXU FLOPs.
HOST_GBYTES_PER_S = tuple(float(round(5 * 1.25**k, 1)) for k in range(0, 22))  # 5 .. 540 GB/s
SCORE_FLOPS = tuple(float(x) for x in (0, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024))
COMM_EXPOSED = tuple(x / 4 for x in range(0, 17))  # 0 .. 4 x the ring model's collective time
DCN_STEP_SECONDS = (0.0,) + tuple(1e-5 * 1.5**k for k in range(0, 16))  # 10 us .. 4.4 ms a DCN step
ROUTE_PASSES = (0.0,) + tuple(float(round(10 * 1.25**k, 1)) for k in range(0, 24))  # 10 .. 1700 passes


def fit(rows: list[CalibrationRow], kind: str) -> Fitted:
    """The constants of `kind` that minimise the mean absolute error over `rows` (a grid search,
    vectorised: a handful of rows and a few constants). A kind is an efficiency model, optionally
    with cause terms: "per_generation+host", "per_generation+dcn", "per_generation+host+attention"."""
    base, *terms = kind.split("+")
    unknown = set(terms) - set(TERMS)
    if unknown:
        raise ValueError(f"unknown term(s) {sorted(unknown)} in {kind!r} (known: {', '.join(TERMS)})")
    if base == "per_generation" and set(terms) <= {"host", "dcn", "route", "link"} and terms:
        link = host_link_bound(rows) if "link" in terms else 0.0
        return _fit_serial_terms(rows, kind, "host" in terms, "dcn" in terms, "route" in terms, link)
    if {"route", "link"} & set(terms):
        raise ValueError(f"{kind!r}: the route and link terms go with per_generation and the host / dcn terms alone")
    if terms:
        best: tuple[float, Fitted] | None = None
        grid = itertools.product(
            HOST_GBYTES_PER_S if "host" in terms else (0.0,),
            SCORE_FLOPS if "attention" in terms else (0.0,),
            COMM_EXPOSED if "comm" in terms else (0.0,),
            DCN_STEP_SECONDS if "dcn" in terms else (0.0,),
        )
        for host, score, comm, dcn in grid:
            constants = Fitted(kind, {}, 0.0, host, score, comm, dcn)
            inner = _fit_base(rows, base, _with_terms(_arrays(rows), constants))
            fitted = replace(
                constants,
                efficiency=inner.efficiency,
                memory_overlap=inner.memory_overlap,
                dropless_ratio=inner.dropless_ratio,
            )
            total = sum(abs(e) for e in errors(rows, fitted))
            if best is None or total < best[0] - 1e-9:
                best = (total, fitted)
        assert best is not None
        return best[1]
    return _fit_base(rows, base, _arrays(rows))


def _fit_serial_terms(
    rows: list[CalibrationRow], kind: str, host: bool, dcn: bool, route: bool = False, link: float = 0.0
) -> Fitted:
    """`fit`'s grid for per_generation with the host, DCN and / or route terms, in one pass: a row's
    error depends on the host bandwidth only if it offloads, on the DCN step only if it crosses
    slices and on the route passes only if it is a dropless MoE step, so each row is evaluated on
    its own terms' grids alone ([host, dcn, route, efficiency, overlap] sums per efficiency group
    instead of a fit per grid point: the leave-one-out passes and the nested band check take
    seconds, not the better part of an hour). `link`: the host link's GB/s a chip (0: no roofline)."""
    a = _arrays(rows)
    a |= link_seconds(a, Fitted(kind, {}, 0.0, host_link_gbytes_per_s=link))
    grids = [
        np.asarray(grid if on else (0.0,))
        for grid, on in ((HOST_GBYTES_PER_S, host), (DCN_STEP_SECONDS, dcn), (ROUTE_PASSES, route))
    ]
    eff = np.asarray(_EFFICIENCIES)[:, None, None]
    overlap = np.asarray(_MEMORY_OVERLAPS)[None, :, None]
    uses = [(a["host"] > 0) & host, (a["dcn_steps"] > 0) & dcn, (a["route"] > 0) & route]
    groups = [fit_group(r.generation, r.moe, not route) for r in rows]
    names = sorted(set(groups))
    of_group = np.asarray([names.index(g) for g in groups])
    sums = np.zeros((len(names), *(len(g) for g in grids), len(_EFFICIENCIES), len(_MEMORY_OVERLAPS)))
    for on in itertools.product((False, True), repeat=3):
        cols = np.logical_and.reduce([u == o for u, o in zip(uses, on)])
        if not cols.any():
            continue
        sub = {name: values[cols] for name, values in a.items()}
        none = np.zeros((1, int(cols.sum())))
        with np.errstate(divide="ignore"):
            host_seconds = sub["host"] / grids[0][:, None] if on[0] else none
        dcn_seconds = grids[1][:, None] * sub["dcn_steps"] if on[1] else none
        route_seconds = grids[2][:, None] * sub["route"] if on[2] else none
        serial = host_seconds[:, None, None, :] + dcn_seconds[None, :, None, :] + route_seconds[None, None, :, :]
        sub["host_seconds"] = serial[:, :, :, None, None, :]
        abs_err = np.abs(_predicted(sub, eff, overlap) - sub["published"])  # [host, dcn, route, eff, overlap, row]
        for g in range(len(names)):
            sums[g] += abs_err[..., of_group[cols] == g].sum(axis=-1)
    totals = sums.min(axis=4).sum(axis=0)  # [host, dcn, route, overlap]: each group at its best efficiency
    h, d, r, o = map(int, np.unravel_index(np.argmin(totals), totals.shape))
    efficiency = {name: _EFFICIENCIES[int(np.argmin(sums[g, h, d, r, :, o]))] for g, name in enumerate(names)}
    return _fitted(
        kind,
        efficiency,
        _MEMORY_OVERLAPS[o],
        host_gbytes_per_s=float(grids[0][h]),
        dcn_step_seconds=float(grids[1][d]),
        route_passes=float(grids[2][r]),
        host_link_gbytes_per_s=link,
    )


def _fitted(kind: str, efficiency: dict[str, float], overlap: float, **terms: float) -> Fitted:
    """The fit of per-group `efficiency`, with "*", a generation without rows and without a line
    in its peak (`Fitted.efficiency_of`: the median chip's dense efficiency, each known generation
    one sample: a fit over all rows would be the most-published generation's), and the median
    dropless / dense ratio of the generations with both."""
    dense = {g: e for g, e in efficiency.items() if "/" not in g}
    ratios = [e / dense[g.split("/")[0]] for g, e in efficiency.items() if "/" in g and g.split("/")[0] in dense]
    # Rows of dropless MoE steps alone (a nested check's remainder) leave no dense efficiency: their own then.
    fallback = {"*": float(np.median(list(dense.values()) or list(efficiency.values())))}
    return Fitted(kind, {**efficiency, **fallback}, overlap, **terms, dropless_ratio=float(np.median(ratios or [1.0])))


def _fit_base(rows: list[CalibrationRow], kind: str, a: dict[str, np.ndarray]) -> Fitted:
    """The efficiency model `kind` fitted to the rows' arrays `a` (cause terms already in them)."""
    eff = np.asarray(_EFFICIENCIES)[:, None, None]
    overlap = np.asarray(_MEMORY_OVERLAPS)[None, :, None]
    abs_err = np.abs(_predicted(a, eff, overlap) - a["published"])  # [efficiency, overlap, row]
    if kind == "global":
        e, g = map(int, np.unravel_index(np.argmin(abs_err.mean(axis=2)), abs_err.shape[:2]))
        return Fitted(kind, {"*": _EFFICIENCIES[e]}, _MEMORY_OVERLAPS[g])
    if kind == "per_generation":
        # With the overlap fixed, each generation's efficiency only touches its own rows.
        groups = [fit_group(r.generation, r.moe) for r in rows]
        owns = {gen: np.asarray([x == gen for x in groups]) for gen in sorted(set(groups))}
        g = int(np.argmin(sum(abs_err[:, :, own].sum(axis=2).min(axis=0) for own in owns.values())))
        efficiency = {gen: _EFFICIENCIES[int(np.argmin(abs_err[:, g, own].sum(axis=1)))] for gen, own in owns.items()}
        return _fitted(kind, efficiency, _MEMORY_OVERLAPS[g])
    if kind == "mxu_shape":
        wides = np.asarray([w / 100 for w in range(60, 121, 2)])
        is_wide = np.asarray([r.generation in WIDE_MXU for r in rows])
        row_eff = eff[..., None] * np.where(is_wide, wides[:, None], 1.0)[None, None, :, :]  # [e, 1, wide, row]
        err = np.abs(_predicted(a, row_eff, overlap[..., None]) - a["published"]).mean(axis=3)  # [e, g, wide]
        err = np.where(eff * wides[None, None, :] <= 1.0, err, np.inf)
        e, g, w = map(int, np.unravel_index(np.argmin(err), err.shape))
        base = _EFFICIENCIES[e]
        return Fitted(kind, {"*": base, **{name: base * float(wides[w]) for name in WIDE_MXU}}, _MEMORY_OVERLAPS[g])
    raise ValueError(f"unknown efficiency model {kind!r} (known: {', '.join(EFFICIENCY_MODELS)})")


def leave_one_out(rows: list[CalibrationRow], kind: str) -> list[float]:
    """Each row's error (points) when the constants are fitted to the other rows alone."""
    return [errors([row], fit([r for r in rows if r is not row], kind))[0] for row in rows]


def leave_generation_out(rows: list[CalibrationRow], kind: str) -> list[float | None]:
    """Each row's error when the constants are fitted to the other generations' rows alone (its
    generation then takes the fallback "*" constants): what planning a generation without
    calibration rows costs. None for the rows of a generation that is the only one."""
    unseen: dict[int, float] = {}
    for generation in sorted({r.generation for r in rows}):
        others = [r for r in rows if r.generation != generation]
        if not others:
            continue
        mine = [r for r in rows if r.generation == generation]
        unseen.update(zip(map(id, mine), errors(mine, fit(others, kind))))
    return [unseen.get(id(r)) for r in rows]


def load_rows(path: Path = ROWS_FILE) -> list[CalibrationRow]:
    """The calibration rows kept in `path` (benchmarks/planner/plan_calibration.py writes them)."""
    names = {f.name for f in fields(CalibrationRow)}
    return [CalibrationRow(**{k: v for k, v in row.items() if k in names}) for row in json.loads(path.read_text())]


def band_rows(rows: list[CalibrationRow], kind: str) -> tuple[list[float], list[BandRow]]:
    """The rows' leave-one-out errors, and their places with those errors and their errors with
    their generation unseen: what every band is made of (band.py)."""
    loo = leave_one_out(rows, kind)
    unseen = leave_generation_out(rows, kind)
    return loo, [band_row(r, e, u) for r, e, u in zip(rows, loo, unseen)]


def noise_floor(path: Path = RERUNS_FILE) -> float:
    """The conformal 90% quantile of the re-measured recipes' differences (band.py's floor); 0
    without the file."""
    try:
        differences = [abs(r["difference_points"]) for r in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("no re-measured recipes (%s): bands without a noise floor", exc)
        return 0.0
    return conformal_quantile(differences) if differences else 0.0


def band_check(
    rows: list[CalibrationRow],
    kind: str,
    floor: float = 0.0,
    per_distance: Callable[[CalibrationRow], float] | None = None,
) -> list[tuple[float, ErrorBand]]:
    """Each row's leave-one-out error with the band it would have been printed with: the band
    made from the other rows alone, each with its own leave-one-out error among them (nested), so
    no row's error enters its own band; widened for its novelties by `per_distance(row)` a unit
    of distance (novelty.py; None: not widened). The share of |error| <= band is the bands' coverage."""
    out: list[tuple[float, ErrorBand]] = []
    for i, row in enumerate(rows):
        others = rows[:i] + rows[i + 1 :]
        error = errors([row], fit(others, kind))[0]
        band = band_far(place_of(row), band_rows(others, kind)[1], floor, per_distance(row) if per_distance else 0.0)
        assert band is not None  # others is never empty here, so the band has rows
        out.append((error, band))
    return out
