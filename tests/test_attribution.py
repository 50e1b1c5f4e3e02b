"""Failure attribution from a study's evidence (studies/attribution.py): single values, a
combination, ties settled by probes, and no cause from one failure or a value that also worked."""

from __future__ import annotations

from tpu_tuner.studies.attribution import Evidence, attribute

KINDS = ("crash", "oom", "timeout", "error")


def _ok(number: int, **setting: str) -> Evidence:
    return Evidence(number, setting, dict.fromkeys(KINDS, False))


def _failed(number: int, kind: str, **setting: str) -> Evidence:
    return Evidence(number, setting, {kind: True}, "worker died from SIGSEGV")


def test_a_value_in_two_failures_and_no_success_is_the_cause() -> None:
    evidence = [
        _ok(0, autocast="none", compile="eager", threads="2"),
        _failed(1, "crash", autocast="bfloat16", compile="eager", threads="2"),
        _ok(2, autocast="none", compile="inductor", threads="2"),
        _failed(3, "crash", autocast="bfloat16", compile="inductor", threads="1"),
        _ok(4, autocast="none", compile="inductor", threads="1"),
    ]
    (cause,) = attribute(evidence).causes
    assert cause.values == (("autocast", "bfloat16"),) and cause.kind == "crash"
    assert (cause.failures_with, cause.settings_with, cause.failures_without, cause.settings_without) == (2, 2, 0, 3)
    assert cause.after_trial == 4
    assert cause.matches({"autocast": "bfloat16", "compile": "eager"})
    assert not cause.matches({"autocast": "none"})
    words = cause.describe(lambda name, value: f"{name} {value}")
    assert words == "autocast bfloat16 excluded after trial 4: crash in 2 of 2 settings with it, 0 of 3 without"


def test_one_failure_is_no_evidence_and_a_value_that_worked_is_never_a_cause() -> None:
    one = [_ok(0, autocast="none"), _failed(1, "crash", autocast="bfloat16")]
    assert attribute(one).causes == []
    cleared = [
        _ok(0, autocast="none", compile="eager"),
        _failed(1, "crash", autocast="bfloat16", compile="eager"),
        _failed(2, "crash", autocast="bfloat16", compile="inductor"),
        _ok(3, autocast="bfloat16", compile="eager"),
    ]
    # bf16 worked once: two crashes with it are not its fault; no pair is held by two failures alone.
    assert attribute(cleared).causes == []


def test_a_suspect_one_failure_points_at_is_open_until_settled() -> None:
    one = [_ok(0, autocast="none", compile="eager"), _failed(1, "crash", autocast="bfloat16", compile="eager")]
    (suspect,) = attribute(one).open
    assert (suspect.values, suspect.kind, suspect.failures) == ((("autocast", "bfloat16"),), "crash", (1,))
    assert suspect.matches({"autocast": "bfloat16", "compile": "inductor"}) and not suspect.matches(
        {"autocast": "none"}
    )
    # Cleared by a success, or confirmed by a second failure (then a cause): open no more. Once
    # bf16 worked with inductor, bf16 with eager is the open suspect (a combination may be it).
    (pair,) = attribute([*one, _ok(2, autocast="bfloat16", compile="inductor")]).open
    assert pair.values == (("autocast", "bfloat16"), ("compile", "eager"))
    confirmed = attribute([*one, _failed(2, "crash", autocast="bfloat16", compile="inductor")])
    assert [c.values for c in confirmed.causes] == [(("autocast", "bfloat16"),)]
    # The failures bf16 explains leave nothing else open (eager never worked with bf16 either).
    assert confirmed.open == []


def test_a_combination_is_the_cause_when_neither_value_fails_alone() -> None:
    evidence = [
        _ok(0, backend="eager", fullgraph="off", opt="sgd"),
        _ok(1, backend="inductor", fullgraph="off", opt="sgd"),
        _ok(2, backend="aot_eager", fullgraph="on", opt="sgd"),
        _failed(3, "error", backend="inductor", fullgraph="on", opt="sgd"),
        _ok(4, backend="inductor", fullgraph="off", opt="adam"),
        _ok(5, backend="aot_eager", fullgraph="on", opt="adam"),
        _failed(6, "error", backend="inductor", fullgraph="on", opt="adam"),
    ]
    (cause,) = attribute(evidence).causes
    assert cause.values == (("backend", "inductor"), ("fullgraph", "on"))
    assert cause.matches({"backend": "inductor", "fullgraph": "on", "opt": "sgd"})
    assert not cause.matches({"backend": "aot_eager", "fullgraph": "on"})
    assert cause.describe(lambda n, v: f"{n} {v}").startswith(
        "the combination backend inductor with fullgraph on excluded"
    )


def test_two_values_that_always_came_together_are_told_apart_by_a_probe() -> None:
    evidence = [
        _ok(0, autocast="none", layout="plain", opt="sgd"),
        _failed(1, "oom", autocast="bfloat16", layout="wide", opt="sgd"),
        _ok(2, autocast="none", layout="plain", opt="adam"),
        _failed(3, "oom", autocast="bfloat16", layout="wide", opt="adam"),
    ]
    found = attribute(evidence)
    # bf16 or the wide layout: the evidence cannot say which, but a setting with both fails.
    (pair,) = found.causes
    assert pair.values == (("autocast", "bfloat16"), ("layout", "wide"))
    (probe,) = found.probes
    assert probe.failing_trial == 1 and probe.kind == "oom"  # both as near a success: the earlier
    # The failing setting with one suspect changed back to the nearest setting that worked.
    assert probe.setting == {"autocast": "none", "layout": "wide", "opt": "sgd"}
    # The probe fails too: the wide layout is enough, autocast is cleared of the out-of-memory.
    failed_probe = _failed(4, "oom", **probe.setting)
    (cause,) = attribute([*evidence, failed_probe]).causes
    assert cause.values == (("layout", "wide"),)
    # Or it works: then the wide layout is cleared and bf16 is the cause.
    (cause,) = attribute([*evidence, _ok(4, **probe.setting)]).causes
    assert cause.values == (("autocast", "bfloat16"),)


def test_kinds_are_attributed_apart() -> None:
    accuracy = {"accuracy": True, **dict.fromkeys(KINDS, False)}
    fine = {"accuracy": False, **dict.fromkeys(KINDS, False)}
    evidence = [
        Evidence(0, {"precision": "highest", "autocast": "none"}, fine),
        Evidence(1, {"precision": "high", "autocast": "none"}, accuracy),
        _failed(2, "crash", precision="highest", autocast="bfloat16"),
        Evidence(3, {"precision": "high", "autocast": "none", "x": "1"}, accuracy),
        _failed(4, "crash", precision="medium", autocast="bfloat16"),
    ]
    causes = {c.kind: c.values for c in attribute(evidence).causes}
    # A crash says nothing of accuracy: precision high is the accuracy cause with two failures of it.
    assert causes == {"accuracy": (("precision", "high"),), "crash": (("autocast", "bfloat16"),)}


def test_a_conditional_value_and_its_parent_are_told_apart_by_another_choice() -> None:
    # compile_options exists only under inductor: the nearest success (eager) lacks it, so the
    # probe tries another of its choices.
    evidence = [
        _ok(0, execution="eager", autocast="none"),
        Evidence(
            1, {"execution": "inductor", "compile_options": "default", "autocast": "none"}, {"compile_cost": True}
        ),
        _ok(2, execution="eager", autocast="bfloat16"),
        Evidence(
            3, {"execution": "inductor", "compile_options": "default", "autocast": "bfloat16"}, {"compile_cost": True}
        ),
    ]
    for e in (evidence[0], evidence[2]):
        e.outcomes["compile_cost"] = False  # type: ignore[index]
    choices = {"compile_options": ["default", "freezing", "max-autotune"]}
    found = attribute(evidence, alternatives=lambda name, value: [c for c in choices.get(name, []) if c != value])
    assert [c.values for c in found.causes] == [(("compile_options", "default"), ("execution", "inductor"))]
    (probe,) = found.probes
    assert probe.setting == {"execution": "inductor", "compile_options": "freezing", "autocast": "none"}
    cut_off_too = Evidence(4, probe.setting, {"compile_cost": True})
    (cause,) = attribute([*evidence, cut_off_too]).causes
    assert cause.values == (("execution", "inductor"),)


def test_a_pair_whose_failures_a_cause_explains_is_not_blamed() -> None:
    """The GRU case (issue 38): torch.compile captures no graph, so every inductor setting fails
    (3 of 3); the two failures with autocast bf16 and 1 thread were both inductor settings. The
    pair is not excluded: inductor explains both of its failures."""
    evidence = [
        _ok(0, execution="eager", autocast="none", threads="2", memory_format="contiguous"),
        _failed(1, "crash", execution="inductor", autocast="none", threads="2", memory_format="contiguous"),
        _ok(2, execution="eager", autocast="bfloat16", threads="2", memory_format="contiguous"),
        _failed(3, "crash", execution="inductor", autocast="bfloat16", threads="1", memory_format="contiguous"),
        _ok(4, execution="eager", autocast="none", threads="1", memory_format="contiguous"),
        _failed(5, "crash", execution="inductor", autocast="bfloat16", threads="1", memory_format="channels_last"),
    ]
    found = attribute(evidence)
    (cause,) = found.causes
    assert cause.values == (("execution", "inductor"),)
    assert (cause.failures_with, cause.settings_with) == (3, 3)
    # Nothing is left open either: every failure is explained.
    assert found.open == [] and found.probes == []


def test_a_value_is_blamed_only_for_the_failures_left_unexplained() -> None:
    # Inductor fails 4 of 4; bf16 failed in 3 settings, but two of them were inductor's: one
    # failure is left to bf16, too few to exclude it, and it stays open.
    evidence = [
        _ok(0, execution="eager", autocast="none", threads="2"),
        _failed(1, "crash", execution="inductor", autocast="none", threads="2"),
        _failed(6, "crash", execution="inductor", autocast="none", threads="1"),
        _failed(2, "crash", execution="inductor", autocast="bfloat16", threads="2"),
        _failed(3, "crash", execution="inductor", autocast="bfloat16", threads="1"),
        _failed(4, "crash", execution="eager", autocast="bfloat16", threads="1"),
        _ok(5, execution="eager", autocast="none", threads="1"),
    ]
    found = attribute(evidence)
    assert [c.values for c in found.causes] == [(("execution", "inductor"),)]
    assert [s.values for s in found.open] == [(("autocast", "bfloat16"),)]
    # A second failure of bf16 without inductor: now two unexplained failures make it a cause
    # (and held by as many failures as inductor, neither is judged after the other).
    more = attribute([*evidence, _failed(7, "crash", execution="eager", autocast="bfloat16", threads="2")])
    assert sorted(c.values for c in more.causes) == [(("autocast", "bfloat16"),), (("execution", "inductor"),)]
    assert more.open == []


# The chip's Llama-class run (issue 54): the baseline (every knob at its first value) failed the
# accuracy check under TorchTPU's default matmul precision, and so did a setting sharing its
# values; the other settings failed otherwise and said nothing of accuracy.
CHIP_BASELINE = {"activation_checkpointing": "none", "matmul": "medium", "autocast": "none", "fuse": "off"}
ACCURACY = {"accuracy": True, **dict.fromkeys(KINDS, False)}


def test_a_kind_the_baseline_fails_with_is_blamed_on_no_value_it_holds() -> None:
    evidence = [
        Evidence(0, CHIP_BASELINE, ACCURACY),
        Evidence(1, {**CHIP_BASELINE, "fuse": "on"}, ACCURACY),
        _failed(2, "error", **{**CHIP_BASELINE, "autocast": "bfloat16"}),
        _failed(3, "crash", **{**CHIP_BASELINE, "activation_checkpointing": "full"}),
    ]
    # Without knowing the baseline the kind is still blamed on nothing: no setting got past it.
    assert attribute(evidence).causes == []
    found = attribute(evidence, baseline=CHIP_BASELINE)
    assert found.causes == found.probes == [] and all(s.kind != "accuracy" for s in found.open)
    (note,) = [n for n in found.not_blamed if n.kind == "accuracy"]
    assert (note.baseline_trial, note.failures, note.settings, note.after_trial) == (0, 2, 2, 1)
    assert note.describe() == (
        "the baseline (trial 0) fails with accuracy too (accuracy): not blamed on any knob value; "
        "2 of 2 settings failed with it, up to trial 1"
    )
    # A setting that got past the check does not change that: the baseline's values are not
    # blamed though matmul medium is held by both failures and not by the success.
    passed = Evidence(4, {**CHIP_BASELINE, "matmul": "highest"}, {"accuracy": False, **dict.fromkeys(KINDS, False)})
    assert [c.values for c in attribute([*evidence, passed]).causes] == [(("matmul", "medium"),)]
    found = attribute([*evidence, passed], baseline=CHIP_BASELINE)
    assert found.causes == [] and all(s.kind != "accuracy" for s in found.open)
    assert [(n.kind, n.baseline_trial, n.failures, n.settings) for n in found.not_blamed] == [("accuracy", 0, 2, 3)]


def test_a_kind_no_setting_got_past_is_blamed_on_no_value() -> None:
    """A device fault fails every setting alike ("a required argument is in a failed state"): no
    value is blamed, not even one every failure holds ("0 of 0 without")."""
    fault = "RuntimeError: a required argument is in a failed state"
    evidence = [
        Evidence(1, {"autocast": "bfloat16", "threads": "1", "fuse": "on"}, {"error": True}, fault),
        Evidence(2, {"autocast": "bfloat16", "threads": "2", "fuse": "off"}, {"error": True}, fault),
        Evidence(3, {"autocast": "none", "threads": "4", "fuse": "off"}, {"error": True}, fault),
    ]
    found = attribute(evidence, lambda kind, messages: f"the step failed ({messages[0]})")
    assert (found.causes, found.probes, found.open) == ([], [], [])
    (note,) = found.not_blamed
    assert (note.kind, note.baseline_trial, note.failures, note.settings) == ("error", None, 3, 3)
    assert note.describe().startswith(
        "error in every setting so far (the step failed (RuntimeError: a required argument is in a "
        "failed state)): not blamed on any knob value until a setting gets past it; 3 of 3"
    )
    # Two failures sharing values and nothing else measured: neither bf16 nor the pair is blamed.
    assert attribute(evidence[:2]).causes == []
    # One failure is not yet worth a word.
    assert attribute(evidence[:1]).not_blamed == []


# Issue 55: inductor's defaults (conditional parameters the baseline lacks) come with every
# setting naming inductor, so no success holds them before an inductor setting works.
INDUCTOR_DEFAULTS = {"compile_options": "default", "compile_scope": "model"}


def _inductor(number: int, options: str = "default", **setting: str) -> Evidence:
    return _failed(number, "crash", execution="inductor", compile_options=options, compile_scope="model", **setting)


def test_a_value_is_not_tied_with_the_defaults_it_brings() -> None:
    """Two inductor crashes: inductor is the cause, not only its pairs with its default options
    and compile scope (which left a third inductor setting, with other options, to be measured)."""
    evidence = [
        _ok(0, execution="eager", autocast="none"),
        _inductor(1, autocast="none"),
        _ok(2, execution="eager", autocast="bfloat16"),
        _inductor(3, autocast="bfloat16"),
    ]
    found = attribute(evidence, defaults=INDUCTOR_DEFAULTS)
    assert [c.values for c in found.causes] == [(("execution", "inductor"),)]
    assert (found.probes, found.open) == ([], [])
    assert found.causes[0].matches({"execution": "inductor", "compile_options": "freezing", "autocast": "none"})
    # One crash: inductor alone is open (its next setting is measured to its verdict).
    assert [s.values for s in attribute(evidence[:2], defaults=INDUCTOR_DEFAULTS).open] == [
        (("execution", "inductor"),)
    ]
    # Unknown defaults: the three tie, and only their pairs are excluded.
    assert sorted(len(c.values) for c in attribute(evidence).causes) == [2, 2, 2]
    # A success of another compiling mode with the other scope does not make the scope a rival.
    passed = Evidence(4, {"execution": "aot_eager", "compile_scope": "model+loss"}, dict.fromkeys(KINDS, False))
    assert [c.values for c in attribute([*evidence, passed], defaults=INDUCTOR_DEFAULTS).causes] == [
        (("execution", "inductor"),)
    ]


def test_a_non_default_option_still_ties_and_a_default_failing_alone_is_blamed() -> None:
    # Fullgraph is no default: with inductor it is a tie, settled by a probe with the default options.
    evidence = [
        _ok(0, execution="eager", autocast="none"),
        _inductor(1, "fullgraph", autocast="none"),
        _ok(2, execution="eager", autocast="bfloat16"),
        _inductor(3, "fullgraph", autocast="bfloat16"),
    ]
    choices = {"compile_options": ["default", "fullgraph"], "compile_scope": ["model", "model+loss"]}
    found = attribute(evidence, alternatives=lambda n, v: [c for c in choices[n] if c != v], defaults=INDUCTOR_DEFAULTS)
    assert [c.values for c in found.causes] == [(("compile_options", "fullgraph"), ("execution", "inductor"))]
    (probe,) = found.probes
    assert probe.setting["compile_options"] == "default" and probe.setting["execution"] == "inductor"
    # The default scope failing under two compiling modes has no value it came along with: blamed.
    scope = [
        _ok(0, execution="eager"),
        _failed(1, "crash", execution="aot_eager", compile_scope="model"),
        _inductor(2),
    ]
    assert [c.values for c in attribute(scope, defaults=INDUCTOR_DEFAULTS).causes] == [(("compile_scope", "model"),)]
