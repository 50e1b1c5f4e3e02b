"""Every choice of one knob on top of a base setting, re-measured interleaved in one worker.

    python benchmarks/knobs/knob_choices.py --model examples/gpt.py --knob optimizer_impl \\
        --base autocast=bfloat16,micro_batches=4 [--rounds 12]

The base setting's other knobs stay fixed; each choice of `--knob` (its choices in the default
space on this device, narrowed to the workload) runs one step per round, round-robin, after all
were built and warmed up, as the verification does. Printed: each choice's median step and its
paired speedup over the knob's baseline choice with a 95% interval. For the quiet per-knob
figures of docs/knobs.md and the question a single grid measurement cannot settle (is the fused
optimizer really faster on this step?).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpu_tuner.metrics.paired import paired_speedup
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.runner.load import load_summary
from tpu_tuner.runner.requests import ProfileRequest
from tpu_tuner.runner.trial_runner import TrialRunner
from tpu_tuner.tuning import TuneOptions
from tpu_tuner.tuning.agents import load_agents
from tpu_tuner.tuning.options.tune_options import ObjectiveOptions, RunnerOptions
from tpu_tuner.tuning.search.search_space import SearchSpace
from tpu_tuner.tuning.verify.interleaved import compare_interleaved


def _parse(pairs: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs.split(",") if pair)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("examples/gpt.py"))
    parser.add_argument("--knob", required=True)
    parser.add_argument("--base", default="", help="knob=value,... the other knobs (default: the baseline)")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    options = TuneOptions(
        objective=ObjectiveOptions(verify_rounds=args.rounds),
        runner=RunnerOptions(trial_settings=ProfilerSettings.load()),
    )
    with TrialRunner(str(args.model)) as runner:
        summary = load_summary(runner, args.model, None, None)
        kind = summary.device_kind or "cpu"
        profiled = runner.run(ProfileRequest(settings=options.runner.trial_settings))
        if not profiled.ok:
            raise SystemExit(f"profiling failed: {profiled.failure.message}")
        from tpu_tuner.knobs.traits import of_profile

        space = SearchSpace.load("default", kind).for_workload(of_profile(profiled.value.workload))
        param = next((p for p in space.params if p.name == args.knob), None)
        if param is None or len(param.choices) < 2:
            raise SystemExit(f"{args.knob} is not searched for {args.model} on {kind}: {space.left_out}")
        base = _parse(args.base)
        agents = load_agents(list(options.search.agents), kind, profiled.value.device.probe)
        candidates, labels = [], []
        for choice in param.choices:
            candidate = space.to_candidate(space.complete({**base, args.knob: choice}))
            rejected = next((r for a in agents if (r := a.validate(candidate))), None)
            if rejected:
                print(f"{choice}: rejected without measuring ({rejected})")
                continue
            candidates.append(candidate.to_dict())
            labels.append(choice)
        compared = compare_interleaved(runner, candidates, args.rounds, options.runner, None)
    if isinstance(compared, str):
        raise SystemExit(f"comparison failed: {compared}")
    samples = compared[0]
    print(f"{args.model}, {args.knob} on top of {base or 'the baseline'}; {args.rounds} interleaved rounds")
    for label, times in zip(labels, samples):
        median = sorted(times)[len(times) // 2]
        over = "" if label == labels[0] else paired_speedup(samples[0], times).describe()
        print(f"  {label:24} median step {median * 1e3:8.1f} ms  {over}")


if __name__ == "__main__":
    main()
