"""Issue 56, item 3: bucketing with the chip's real compile cost. On TorchTPU every new shape is a
compile (static shapes), read from its counters (``torch.tpu._get_cache_stats()``); a chip is
faked here, its counters and timings scripted, so what is measured, what is counted as a cache
hit and how the optimiser uses it are checked without one."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from tpu_tuner.model.buckets.bucket_choice import Strategy, bucket_shares, evaluate, optimal_buckets
from tpu_tuner.model.buckets.bucket_cost import BucketCostModel, ShapeCost, fit_cost_model
from tpu_tuner.model.buckets.lengths import LengthHistogram
from tpu_tuner.runner.bucket_jobs import probe_shapes
from tpu_tuner.tuning.search.bucketing_context import BucketingContext


class ScriptedChip:
    """A TPU's compile cache and clock: a step at a length it has no program for compiles (its
    compile seconds scripted per length), one it has is a cache hit; TorchTPU's counters."""

    def __init__(self, compile_s: Callable[[int], float], step_s: Callable[[int], float]) -> None:
        self.compile_s, self.step_s = compile_s, step_s
        self.programs: set[int] = set()
        self.clock = 0.0
        self.compilations = self.requests = self.hits = 0
        self.first_call_delay: dict[int, float] = {}  # e.g. a transfer the first step pays

    def step_at(self, length: int) -> Callable[[], None]:
        def step() -> None:
            self.requests += 1
            if length in self.programs:
                self.hits += 1
            else:
                self.programs.add(length)
                self.compilations += 1
                self.clock += self.compile_s(length)
            self.clock += self.step_s(length) + self.first_call_delay.pop(length, 0.0)

        return step

    def timed(self, step: Callable[[], None]) -> float:
        start = self.clock
        step()
        return self.clock - start

    def events(self) -> dict[str, int]:
        # The names devices/torchtpu.py gives num_compilations / num_cache_reqs / num_cache_hits.
        return {
            "torch_compile_graphs": 0,
            "tpu_compilations": self.compilations,
            "tpu_cache_requests": self.requests,
            "tpu_cache_hits": self.hits,
        }

    def probe(self, lengths: list[int]) -> list[ShapeCost]:
        return probe_shapes({n: self.step_at(n) for n in lengths}, self.timed, self.events)


def test_a_new_shape_costs_its_first_step_minus_a_warm_one_and_a_cache_hit_costs_nothing() -> None:
    chip = ScriptedChip(compile_s=lambda n: 20.0 + 0.01 * n, step_s=lambda n: 0.001 * n)
    chip.programs.add(256)  # compiled already (e.g. by bounded dynamism): its first step hits the cache
    chip.first_call_delay[256] = 0.5  # yet that first step is slower: not a compile, never charged
    shapes = {s.length: s for s in chip.probe([64, 128, 256])}
    assert shapes[64].compile_seconds == pytest.approx(20.64) and shapes[64].warm_seconds == pytest.approx(0.064)
    assert shapes[128].first_seconds == pytest.approx(21.28 + 0.128)
    assert (shapes[64].compilations, shapes[64].cache_hits, shapes[64].counter) == (1, 0, "tpu_compilations")
    assert shapes[64].compiled and not shapes[64].cache_hit and shapes[64].warm_compilations == 0
    hit = shapes[256]
    assert (hit.compilations, hit.cache_hits, hit.cache_requests) == (0, 1, 1)
    assert hit.cache_hit and hit.compile_seconds == 0.0 and hit.first_seconds == pytest.approx(0.756)


def test_without_a_compile_counter_the_difference_stands_unconfirmed() -> None:
    shape = ShapeCost.measured(64, first=3.0, warm=0.5, delta={})
    assert shape.counter is None and shape.compiled and shape.compile_seconds == 2.5
    # Dynamo's counter where the device has none: nothing compiled, nothing charged.
    assert ShapeCost.measured(64, 3.0, 0.5, {"torch_compile_graphs": 0}).compile_seconds == 0.0


def test_a_warm_step_that_still_compiled_is_counted() -> None:
    chip = ScriptedChip(compile_s=lambda n: 5.0, step_s=lambda n: 0.01)
    step = chip.step_at(32)

    def recompiling() -> None:  # e.g. a graph that changes on its second call
        step()
        if chip.requests == 2:
            chip.compilations += 1

    (shape,) = probe_shapes({32: recompiling}, chip.timed, chip.events)
    assert shape.warm_compilations == 1


def _measured_model(compile_s: Callable[[int], float], step_s: Callable[[int], float]) -> BucketCostModel:
    chip = ScriptedChip(compile_s, step_s)
    shapes = chip.probe([64, 256, 512, 1024])
    return fit_cost_model(
        [(s.length, s.warm_seconds) for s in shapes], [(s.length, s.compile_seconds) for s in shapes], shapes
    )


def test_the_choice_charges_each_bound_its_measured_compile_cost() -> None:
    """Long shapes measured dearer to compile: the optimiser spends its compiles on short bounds,
    where the constant median would have put them elsewhere."""
    hist = LengthHistogram.from_sample(np.arange(8, 1025, 8))
    model = _measured_model(compile_s=lambda n: 2.0 + 0.2 * n, step_s=lambda n: 0.01 + 1e-4 * n)
    assert model.compile_line == pytest.approx((2.0, 0.2))
    assert float(model.compile_seconds_at(1000)) == pytest.approx(202.0)
    assert model.shapes[0].counter == "tpu_compilations" and "4 of 4 new shapes compiled" in model.describe()
    steps = 20_000
    chosen = optimal_buckets(hist, model, steps, 8, 8)
    flat = BucketCostModel(model.compile_seconds, model.coefficients)
    assert chosen != optimal_buckets(hist, flat, steps, 8, 8)
    evaluation = evaluate(chosen, hist, model, steps)
    assert evaluation.compile_seconds == pytest.approx(sum(2.0 + 0.2 * b for b in chosen.bounds))
    assert (
        evaluation.total_seconds <= evaluate(optimal_buckets(hist, flat, steps, 8, 8), hist, model, steps).total_seconds
    )


def test_shapes_the_device_never_compiles_make_every_bucket_free() -> None:
    hist = LengthHistogram.from_sample(np.arange(8, 513, 8))
    chip = ScriptedChip(compile_s=lambda n: 30.0, step_s=lambda n: 0.01 + 1e-4 * n)
    chip.programs.update({64, 256, 512})  # every probed length hits the cache
    shapes = chip.probe([64, 256, 512])
    model = fit_cost_model([(s.length, s.warm_seconds) for s in shapes], [(s.length, 0.0) for s in shapes], shapes)
    assert all(s.cache_hit for s in shapes) and "3 cache hits (no compile cost)" in model.describe()
    assert len(optimal_buckets(hist, model, 1000, 8, 8).bounds) == 8


def test_the_optimiser_stays_exact_with_a_compile_cost_per_length() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        hist = LengthHistogram.from_sample(rng.integers(1, 70, rng.integers(2, 30)))
        model = BucketCostModel(
            0.0,
            (float(rng.uniform(0, 0.01)), float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 1e-5))),
            compile_line=(float(rng.uniform(0, 5)), float(rng.uniform(0, 0.2))),
        )
        max_buckets, align, steps = int(rng.integers(1, 5)), int(rng.choice([1, 4])), int(rng.integers(10, 5000))
        candidates = sorted(set(((hist.lengths + align - 1) // align * align).tolist()))
        brute = min(
            evaluate(Strategy("b", (*chosen, candidates[-1])), hist, model, steps).total_seconds
            for size in range(max_buckets)
            for chosen in itertools.combinations(candidates[:-1], size)
        )
        best = evaluate(optimal_buckets(hist, model, steps, max_buckets, align), hist, model, steps)
        assert best.total_seconds == pytest.approx(brute, rel=1e-9)


def test_each_bucket_states_its_compile_amortised_against_its_padding() -> None:
    hist = LengthHistogram.from_sample([10] * 3 + [30])
    model = BucketCostModel(0.0, (0.0, 1.0, 0.0), compile_line=(5.0, 0.1))
    shares = bucket_shares(Strategy("x", (16, 32)), hist, model, 100)
    assert [(s.bound, s.expected_steps) for s in shares] == [(16, 75.0), (32, 25.0)]
    assert shares[0].compile_seconds == pytest.approx(6.6) and shares[0].compile_per_step == pytest.approx(6.6 / 75)
    assert shares[0].padding_seconds == pytest.approx(75 * 6) and shares[1].padding_per_step == pytest.approx(2.0)
    evaluation = evaluate(Strategy("x", (16, 32)), hist, model, 100)
    assert evaluation.padding_seconds == pytest.approx(75 * 6 + 25 * 2)


def test_a_trial_objective_scales_the_measured_compile_curve_to_the_trial() -> None:
    hist = LengthHistogram.from_sample(np.arange(8, 513, 8))
    shape_model = BucketCostModel(10.0, (0.0, 1e-4, 0.0), compile_line=(5.0, 0.05))
    context = BucketingContext(hist, shape_model, reference_length=100)
    model = context.cost_model_for(step_seconds=0.02, compile_seconds=20.0)
    assert float(model.compile_seconds_at(100)) == pytest.approx(20.0)  # the trial's own compile
    assert float(model.compile_seconds_at(300)) == pytest.approx(20.0 * 20.0 / 10.0)
    flat = BucketingContext(hist, BucketCostModel(10.0, (0.0, 1e-4, 0.0)), reference_length=100)
    assert float(flat.cost_model_for(0.02, 20.0).compile_seconds_at(300)) == 20.0
