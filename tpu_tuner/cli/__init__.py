"""The `tpu-tune` command line: one module a subcommand. The only package that prints to the
terminal or exits.

Each subcommand module holds its `NAME`, `HELP`, `DESCRIPTION`, `add_arguments(parser)` and
`run(args)`. Only the chosen subcommand's flags are built: they read their defaults from the
options dataclasses, and building those of `plan` or `buckets` imports torch, which `tune`
refuses bad options without. A model named right after its command is checked before any
parser is built (model/workloads/model_argument.py): a missing file is refused before torch, numpy or
optuna is imported.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from tpu_tuner.core.errors import TpuTuneError

if TYPE_CHECKING:
    from tpu_tuner.core.device_log import DeviceLog

log = logging.getLogger("tpu_tuner.cli")

# In the order `tpu-tune --help` lists them; each the module tpu_tuner/cli/<name>.py, imported when
# a parser is built (tune's imports optuna and numpy, which a missing model is refused without).
COMMANDS = ("profile", "tune", "plan", "buckets", "dashboard", "study", "devices", "apply")
# The commands whose one positional argument is the model.
MODEL_COMMANDS = ("tune", "profile", "plan", "buckets")
# The commands that run a model on this host and write a run folder (`study finish` too): on a TPU
# host their process's TorchTPU lines go to the folder's device.log, not the terminal.
QUIET_COMMANDS = ("tune", "profile", "buckets")


def _subcommand(name: str) -> ModuleType:
    return importlib.import_module(f"tpu_tuner.cli.{name}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the flags of `command` only (none when None: `tpu-tune --help` lists
    the commands, and building every command's flags would import the planner and torch)."""
    parser = argparse.ArgumentParser(
        prog="tpu-tune",
        description="Profile and tune PyTorch models for TPUs (TorchTPU), GPUs and CPUs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and every library's debug logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show tpu-tune's own log lines (INFO)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr, no warnings")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in map(_subcommand, COMMANDS):
        sub = commands.add_parser(module.NAME, help=module.HELP, description=module.DESCRIPTION)
        if command == module.NAME:
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def _default_to_tune(argv: list[str]) -> list[str]:
    """`tpu-tune model.py ...` means `tpu-tune tune model.py ...`."""
    word = _command_in(argv)
    if word is None or word in COMMANDS:
        return argv
    index = argv.index(word)
    return argv[:index] + ["tune"] + argv[index:]


def _command_in(argv: list[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not a flag; the top level's flags take
    no values), or None (`tpu-tune --help`)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _model_named_first(words: list[str], command: str | None) -> str | None:
    """The model argument of a model command when it is the word right after the command's name
    (argparse reads that word as the model whatever follows), else None: a flag comes first (its
    value could be any later word; the model is checked once the flags are parsed) or help is asked."""
    if command not in MODEL_COMMANDS or "-h" in words or "--help" in words:
        return None
    after = words.index(command) + 1
    return words[after] if after < len(words) and not words[after].startswith("-") else None


# What str.splitlines breaks a line at besides \n and \r (which UserInputError escapes): a typed
# model argument may hold any of them (tests/test_fuzz_cli.py found decoder:\x1e=0), and a
# refusal quotes it.
_LINE_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _refused(exc: TpuTuneError) -> int:
    """Print `exc` as the one line of a refusal; its exit status."""
    from tpu_tuner.core.credentials import redact

    text = "".join(ascii(c)[1:-1] if c in _LINE_BREAKS else c for c in redact(str(exc)))
    print(f"tpu-tune: error: {text}", file=sys.stderr)
    return exc.exit_status


def _configure_logging(args: argparse.Namespace) -> None:
    """The terminal holds the command's own lines: log records reach it from WARNING up (ERROR with
    -q); -v adds tpu-tune's INFO lines, --debug every library's DEBUG ones (matplotlib's font cache,
    torch's registrations and the like never show otherwise)."""
    from tpu_tuner.core.credentials import RedactingFilter

    level = logging.DEBUG if args.debug else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    verbose = args.verbose and not args.debug and not args.quiet
    logging.getLogger("tpu_tuner").setLevel(logging.INFO if verbose else logging.NOTSET)
    for handler in logging.getLogger().handlers:  # no log line shows a password (docs/run-safety.md)
        handler.addFilter(RedactingFilter())


def _quiet_device_output(words: list[str], command: str | None) -> DeviceLog | None:
    """On a host where ``import torch`` loads torch-tpu, a command that runs a model keeps
    TorchTPU's and libtpu's lines in its run folder's device.log, off the terminal
    (core/device_log.py); begun before anything imports torch. --debug shows them, as it shows
    every library's logs."""
    finishes_a_study = command == "study" and words[words.index(command) + 1 :][:1] == ["finish"]
    if (command not in QUIET_COMMANDS and not finishes_a_study) or "--debug" in words:
        return None
    from tpu_tuner.core.tpu_host import loads_torch_tpu

    if not loads_torch_tpu():
        return None
    from tpu_tuner.core import device_log

    return device_log.start()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tpu-tune` console script."""
    words = _default_to_tune(list(sys.argv[1:] if argv is None else argv))
    command = _command_in(words)
    captured = _quiet_device_output(words, command)
    failed = True
    try:
        status = _run(words, command)
        failed = status != 0
        return status
    except SystemExit:  # argparse's --help, or a usage error: nothing ran on the device
        failed = False
        raise
    finally:
        # No run folder was made: a failure's device lines may tell why, so they are kept and named.
        if captured is not None and (kept := captured.finish(keep=failed)) is not None:
            print(f"tpu-tune: what TorchTPU and libtpu wrote in this process is in {kept}", file=sys.stderr)


def _run(words: list[str], command: str | None) -> int:
    """The command `words` name, run; its exit status (a refusal's, too)."""
    if (model := _model_named_first(words, command)) is not None:
        from tpu_tuner.model.workloads.model_argument import check_model_argument

        try:  # before the parser: plan's and buckets' flags import torch
            check_model_argument(model)
        except TpuTuneError as exc:
            if "--debug" in words:
                raise
            return _refused(exc)
    args = build_parser(command).parse_args(words)
    _configure_logging(args)
    from tpu_tuner.core.run_folder import no_space_line

    try:
        if getattr(args, "model_file", None) is not None:
            from tpu_tuner.cli.common import check_lengths, model_source
            from tpu_tuner.model.workloads.model_argument import check_model_argument

            check_model_argument(args.model_file)  # named after flags: not checked above
            if args.command != "plan":  # the planner reads an hf: config its own way
                args.model_file = model_source(args)
                check_lengths(args)
        return args.handler(args)
    except TpuTuneError as exc:
        if args.debug:
            raise
        return _refused(exc)
    except Exception as exc:  # a full disk where no writer said so: an OSError, or SQLite's "disk is full"
        if (line := no_space_line(exc)) is None or args.debug:
            raise
        print(f"tpu-tune: error: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tpu-tune: interrupted", file=sys.stderr)
        return 130


__all__ = ["COMMANDS", "build_parser", "main"]
