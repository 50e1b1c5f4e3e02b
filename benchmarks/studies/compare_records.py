"""Two studies' trial records compared field by field: the same behaviour before and after a change.

Each side is a tuning run folder (its `run.json` names the study) or an Optuna storage URL with
`--study`. Trials are paired by their parameters (the setting they hold), since two runs need not
ask in the same order; each pair's state, objective values and every field of its record (nested
fields flattened to dotted paths) are compared. The record is read as stored, through
`studies.records.attrs` (every layout a tpu-tune version wrote), since the stored format itself is
what is compared.

`--ignore` drops fields by a regular expression matched against the dotted path; the default drops
what two runs of the same code differ in anyway: seconds, ids, the worker and host. With
`--timing` the fields that a timed measurement gives (steps, MFU, overheads, memory peaks measured)
are dropped too, for two tuning runs whose searches measured the same settings on a busy host.

    python benchmarks/studies/compare_records.py BEFORE AFTER [--study NAME] [--timing] [--ignore RE]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.studies import records

# Compile seconds and ids: they differ between two runs of the same code.
DEFAULT_IGNORE = r"(^|\.)(\w*_s|\w*seconds\w*|worker|host|hosts|datetime\w*|trial_id|study_id|log_file)$"
# What a timed measurement gives: differs between two tuning runs on any host.
TIMING_IGNORE = (
    r"(^|\.)(samples|step\w*|mfu|\w*_mfu|amortised\w*|\w*peak_memory\w*|estimated_peak\w*|speed\w*"
    r"|tokens_per_s\w*|accuracy\w*|\w*_error\w*|values|rounds|spread\w*|ratio|best_so_far|message|stopped_early"
    r"|warnings)$"
)


def _open(side: str, study: str | None) -> optuna.Study:
    path = Path(side)
    if path.is_dir():
        saved = json.loads((path / "run.json").read_text())
        storage = saved["storage"]
        if storage.startswith("sqlite:") and (path / "study.db").exists():
            storage = f"sqlite:///{(path / 'study.db').resolve()}"  # the folder may have moved since
        return optuna.load_study(study_name=saved["study_name"], storage=storage)
    if study is None:
        names = optuna.get_all_study_names(storage=side)
        if len(names) != 1:
            raise SystemExit(f"error: {side} holds {len(names)} studies ({', '.join(names)}): name one with --study")
        study = names[0]
    return optuna.load_study(study_name=study, storage=side)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)  # a measurement is stored as one JSON string
        except json.JSONDecodeError:
            pass
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _fields(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    fields = _flat(dict(records.attrs(trial)))
    fields.pop(records.VERSION, None)  # the layout's version: attrs reads every one alike
    fields["state"] = trial.state.name
    fields["values"] = trial.values
    return fields


def _key(trial: optuna.trial.FrozenTrial) -> str:
    return json.dumps(trial.params, sort_keys=True, default=str)


def compare(before: optuna.Study, after: optuna.Study, ignore: re.Pattern[str]) -> list[str]:
    """Lines saying, field by field, where the paired trials' records agree and differ."""
    sides: list[dict[str, list[optuna.trial.FrozenTrial]]] = []
    for study in (before, after):
        by_key: dict[str, list[optuna.trial.FrozenTrial]] = defaultdict(list)
        for t in study.trials:
            by_key[_key(t)].append(t)
        sides.append(by_key)
    pairs = [(b, a) for k in sides[0].keys() & sides[1].keys() for b, a in zip(sides[0][k], sides[1][k])]
    same: Counter[str] = Counter()
    differ: dict[str, list[str]] = defaultdict(list)
    only: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}
    ignored: set[str] = set()
    ended_apart: list[str] = []
    for b, a in pairs:
        if b.state != a.state:
            # Measured on one side, stopped early or pruned on the other (a timed decision): their
            # records hold different fields by design, so only the state is compared.
            ended_apart.append(f"#{b.number}/#{a.number}: {b.state.name} -> {a.state.name}")
            continue
        fb, fa = _fields(b), _fields(a)
        for name in fb.keys() | fa.keys():
            # A field one side lacks is said even where its value would be ignored: a field added
            # or dropped is a change of the format.
            if name not in fa:
                only["before"][name] += 1
            elif name not in fb:
                only["after"][name] += 1
            elif ignore.search(name):
                ignored.add(name)
            elif fb[name] == fa[name]:
                same[name] += 1
            else:
                differ[name].append(f"#{b.number}/#{a.number}: {fb[name]!r} -> {fa[name]!r}")
    unpaired = [sum(len(v) for v in s.values()) - len(pairs) for s in sides]
    lines = [
        f"trials: {len(before.trials)} before, {len(after.trials)} after; {len(pairs)} paired by setting, "
        f"{unpaired[0]} before and {unpaired[1]} after without a pair",
        f"pairs that ended in different states (fields not compared): {len(ended_apart)}"
        + (f" ({'; '.join(ended_apart[:5])})" if ended_apart else ""),
        f"fields identical in every pair where both have them: {sum(1 for n in same if n not in differ)}",
    ]
    for name in sorted(differ):
        shown = "; ".join(differ[name][:3])
        lines.append(f"DIFFERS {name}: {len(differ[name])} of {len(differ[name]) + same[name]} pairs ({shown})")
    for side, counts in only.items():
        for name, n in sorted(counts.items()):
            lines.append(f"ONLY {side.upper()} {name}: in {n} pairs")
    lines.append(f"ignored ({len(ignored)}): {', '.join(sorted(ignored))}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a tuning run folder or an Optuna storage URL")
    parser.add_argument("after", help="the same, after the change")
    parser.add_argument("--study", default=None, help="the study's name where a storage URL holds several")
    parser.add_argument("--timing", action="store_true", help="also ignore what a timed measurement gives")
    parser.add_argument("--ignore", default=None, help="fields to ignore, a regular expression (default: seconds, ids)")
    args = parser.parse_args()
    pattern = args.ignore or DEFAULT_IGNORE
    if args.timing:
        pattern = f"{pattern}|{TIMING_IGNORE}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for line in compare(_open(args.before, args.study), _open(args.after, args.study), re.compile(pattern)):
        print(line)


if __name__ == "__main__":
    main()
