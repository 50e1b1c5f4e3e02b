"""`tpu-tune tune` (also `tpu-tune MODEL.py`): search, verify, write a tuned config.

Every flag is generated from the field of `TuneOptions` it sets (tuning/options/tune_options.py): its name,
help and default are stated there, once.
"""

from __future__ import annotations

import argparse

from tpu_tuner.cli.common import add_model_args, dashboard_lines
from tpu_tuner.core.flags import add_section, sections_from
from tpu_tuner.metrics.mfu import mfu_text
from tpu_tuner.tuning.options.tune_options import SECTIONS, TuneOptions

NAME = "tune"
HELP = "search eager/compile mode and precision with Optuna; verify the win; write a tuned config"
DESCRIPTION = "Tune a model file (also: tpu-tune MODEL.py)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tune command's flags: the model's, then every section's."""
    add_model_args(parser)
    for section in SECTIONS.values():
        add_section(parser, section)


def options_from(args: argparse.Namespace) -> TuneOptions:
    """The options the flags name, each section checked as it is built (`UserInputError`)."""
    return TuneOptions(**sections_from(args, SECTIONS))


def run(args: argparse.Namespace) -> int:
    """Tune, printing progress; then the baseline against the tuned setting, and where it is."""
    from tpu_tuner.core.credentials import without_password
    from tpu_tuner.studies.storage import storage_from_environment

    # Bad options, space or storage are refused here, in well under a second: before torch and
    # optuna are imported, before any model runs and before a run folder exists.
    options = options_from(args).preflight()
    from tpu_tuner.api import tune
    from tpu_tuner.cli.common import quiet_optuna
    from tpu_tuner.cli.tune_progress import ProgressLines
    from tpu_tuner.core.units import ms
    from tpu_tuner.knobs.candidate import Candidate

    quiet_optuna(args.debug)
    show = ProgressLines()
    if options.runner.nnodes > 1:
        from tpu_tuner.api import tune_across_hosts
        from tpu_tuner.tuning.run.tuning_result import TuningResult

        outcome = tune_across_hosts(args.model_file, options, progress=show)
        if not isinstance(outcome, TuningResult):  # a follower: the driver has the results
            print(f"hosts     {outcome.reason} ({outcome.jobs} job(s) ran on this host's ranks)")
            return 1 if outcome.failed else 0
        result = outcome
    else:
        result = tune(args.model_file, options, progress=show)
    v = result.verification
    print()
    url = options.store.url
    if not result.verified:
        print(f"search    done: {v.message}")
        print(f"results   {result.run_dir}/ (report.md, trials.csv: this worker's view of the study)")
        storage = "" if url is None or url == storage_from_environment() else f" --storage {without_password(url)}"
        print(
            f"status    tpu-tune study status{storage} --study {result.study.study_name}"
            + (f" --out {options.outputs.out}" if url is None else "")
        )
        return 0
    compared = result.compared
    base, chosen = compared.baseline, compared.tuned
    if base is not None and chosen is not None:
        planned = options.objective.planned_steps
        print(
            f"baseline  steady step {ms(base.step_median)}, amortised {ms(base.amortised_step(planned))}, "
            f"MFU {mfu_text(base.mfu)}  ({Candidate.from_dict(base.candidate).describe()})"
        )
        print(
            f"tuned     steady step {ms(chosen.step_median)}, amortised {ms(chosen.amortised_step(planned))}, "
            f"MFU {mfu_text(chosen.mfu)}  ({v.chosen.describe()})"
        )
        if compared.from_window:
            print(
                f"          (steady step: median of the {compared.rounds} rounds of the interleaved verification "
                f"window; amortised adds the search's compile time / {planned} planned steps)"
            )
            for said in result.step_disagreements:
                print(f"note      {said}")
        else:
            print(
                f"          (from the search: {compared.why_search}; "
                f"amortised = steady step + compile time / {planned} planned steps)"
            )
        against = (
            ""
            if chosen.baseline_error is None or chosen.error_vs_baseline is None
            else f" (the baseline's {chosen.baseline_error:.2e}), {chosen.error_vs_baseline:.2e} vs the baseline"
        )
        print(
            f"accuracy  relative error {chosen.accuracy_error:.2e} vs fp32{against} "
            f"(tolerance {options.objective.tolerance:g} beyond the baseline's)"
        )
    print(f"speedup   {v.message}")
    if v.speedup is not None:
        print("          (steady step against steady step, re-measured interleaved; compile time is not in it)")
        if compared.from_window and compared.ratio is not None and v.recommends_tuned:
            # Two estimators of one window: close, not identical.
            print(f"          (geometric mean of the per-round ratios; the medians above give {compared.ratio:.2f}x)")
    print(f"results   {result.run_dir}/ (tuned_config.toml, report.md, trials.csv, plots)")
    for line in dashboard_lines(result.run_dir, str(result.best_config.provenance["study"]["storage"])):
        print(line)
    return 0
