"""The Python API's entry points that both run a feature and write its run folder.

A feature (tuning, the planner, bucketing) computes its result; the outputs layer writes it; this
module joins the two, so that `tpu_tuner.tune(...)` and `tpu-tune tune` leave the same folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.outputs.write import write_tuning
from tpu_tuner.profiling.settings import ProfilerSettings
from tpu_tuner.tuning.options.tune_options import TuneOptions
from tpu_tuner.tuning.run.progress import Progress, ProgressCallback
from tpu_tuner.tuning.run.study_admin import finish_study as _finish_study
from tpu_tuner.tuning.run.tune_run import run_tuning
from tpu_tuner.tuning.run.tuning_result import TuningResult

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from tpu_tuner.runner.host_jobs import FollowEnd


def tune(
    model_file: str | Path, options: TuneOptions | None = None, progress: ProgressCallback | None = None
) -> TuningResult:
    """Tune a model file; returns the result and writes the run folder.

    This process never imports the model file: a worker loads it and describes it. Bad options are
    refused before that, and a run that fails after its folder exists is marked "failed" in
    run.json with the reason (docs/run-safety.md). With `options.store.study` the run is one worker of a
    study shared by name (docs/tuning.md).
    """
    if options is not None:
        check_field_types(options, {"ProfilerSettings": ProfilerSettings})
    if options is not None and options.runner.nnodes > 1:
        raise UserInputError(
            f"--nnodes {options.runner.nnodes}: every host runs its side of the study; "
            "call tpu_tuner.api.tune_across_hosts (what `tpu-tune` does)"
        )
    return run_tuning(model_file, options, progress, write_tuning)


def tune_across_hosts(
    model_file: str | Path, options: TuneOptions, progress: ProgressCallback | None = None
) -> TuningResult | FollowEnd:
    """One host's side of a study whose trials span `options.runner.nnodes` hosts: the same call
    on every host. The hosts meet at the rendezvous (`runner/hosts.py`); the driver (node 0)
    tunes as `tune` does, every trial on all hosts' ranks, and returns its result; any other host
    runs the jobs the driver sends until the study ends and returns how it ended (`FollowEnd`).
    `HostsMissing` when the hosts do not all come; `HostsError` when one goes away for good."""
    from tpu_tuner.runner.host_jobs import farewell, follow
    from tpu_tuner.runner.hosts import HostGroup
    from tpu_tuner.runner.worker_log import WorkerLog

    check_field_types(options, {"ProfilerSettings": ProfilerSettings})
    options = options.preflight()  # every host refuses bad options before it meets the others
    run, emit, started = options.runner, progress or (lambda event: None), time.perf_counter()
    assert run.rdzv is not None and options.store.study is not None  # validated by preflight
    group = HostGroup(
        run.rdzv,
        options.store.study,
        run.nnodes,
        run.nproc,
        run.rdzv_timeout_s,
        _fixed_node_rank(options),
        run.max_restarts,
    )
    emit(Progress("hosts", f"waiting at {run.rdzv} for {run.nnodes} hosts (up to {run.rdzv_timeout_s:g} s)"))
    group.join()
    try:
        me = group.me()
        role = "the driver: it runs the study" if group.is_driver else "it runs the ranks the driver sends"
        emit(
            Progress(
                "hosts",
                f"{run.nnodes} hosts met; this is {me.describe()}, {role}",
                elapsed=time.perf_counter() - started,
            )
        )
        if not group.is_driver:
            folder = Path(options.outputs.out) / f"{options.store.study}-hosts"
            folder.mkdir(parents=True, exist_ok=True)
            with WorkerLog(folder / f"node{me.node}-{me.host}.log") as log:
                return follow(group, log, _environments(run.nproc, run.nnodes))
        try:
            result = run_tuning(model_file, options, progress, write_tuning, hosts=group)
        except BaseException as exc:
            farewell(
                group,
                f"the driver stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                failed=True,
            )
            raise
        farewell(
            group, f"the study ended on the driver ({me.describe()}); results in {result.run_dir} there", failed=False
        )
        return result
    finally:
        group.close()


def _fixed_node_rank(options: TuneOptions) -> int | None:
    """This host's node rank where it is fixed: --node-rank, else the device's (TorchTPU's
    NODE_RANK on a TPU host: its place in the slice, which the ranks' order must follow); the two
    must agree."""
    from tpu_tuner.devices import backend_class, backend_classes

    run = options.runner
    named = [backend_class(run.device)] if run.device else backend_classes()
    backend = next((b for b in named if b.device_on_host()), None)
    if backend is None:
        return run.node_rank
    slice_rank = backend.host_node_rank(run.nproc, run.nnodes)
    if run.node_rank is not None and slice_rank is not None and slice_rank != run.node_rank:
        raise UserInputError(
            f"--node-rank {run.node_rank}: {backend.label} places this host at NODE_RANK "
            f"{slice_rank} of the slice; give that, or leave --node-rank out"
        )
    return run.node_rank if run.node_rank is not None else slice_rank


Environments = tuple[dict[str, str], Callable[[int], dict[str, str]]]


def _environments(nproc: int, nnodes: int) -> Callable[[str | None], Environments]:
    """A follower's launch and per-rank variables by device kind, decided on this host once."""
    from tpu_tuner.devices import backend_class

    decided: dict[str, Environments] = {}

    def environments(kind: str | None) -> Environments:
        backend = backend_class(kind or "cpu")
        if backend.kind not in decided:
            decided[backend.kind] = (backend.launch_environment(nproc, nnodes), backend.rank_environment)
        return decided[backend.kind]

    return environments


def study_storage(url: str) -> BaseStorage:
    """The storage of tpu-tune's studies at `url`, opened as Optuna's own tools take it: a
    PostgreSQL server keeps its studies in tpu-tune's journal tables, which Optuna cannot open by
    URL, so ``optuna.load_study(study_name=NAME, storage=tpu_tuner.study_storage(URL))`` reads
    one, and ``optuna_dashboard.run_server(tpu_tuner.study_storage(URL))`` shows it (as
    `tpu-tune study dashboard` does). SQLite and MySQL studies are Optuna's RDB storage as usual."""
    from tpu_tuner.studies.liveness import read_storage
    from tpu_tuner.studies.storage import check_storage

    check_storage(url)  # a bad URL or an unreachable server is one line, without the password
    return read_storage(url)


def finish_study(
    storage: str, name: str, out: Path, model_file: Path | None = None, device: str | None = None, now: bool = False
) -> TuningResult:
    """Verify the best of shared study `name` once, on this host, and write its run folder
    (`tpu-tune study finish`)."""
    return _finish_study(storage, name, out, model_file, device, now, write_outputs=write_tuning)
