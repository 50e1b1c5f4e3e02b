"""A Hugging Face model named on the command line: ``hf:`` plus where its config comes from.

A local folder holding config.json (``hf:./Llama-3.2-1B/``), a hub id (``hf:Qwen/Qwen2.5-0.5B``:
config only, from the local hub cache or fetched), or a transformers model type
(``hf:llama``); ``?key=value,...`` overrides a config key of any of the three, and after ``#`` come
workload options (inference, weights, task=causal-lm|masked-lm|seq2seq|classification): the CLI
writes ``--inference`` and ``--weights`` there, so the source string alone rebuilds the same
workload in every worker process. docs/hf-models.md, "Where the config comes from".

Only the config is read here (transformers' ``AutoConfig``); `model/workloads/hf_workload.py` builds the
model. Every problem is one `UserInputError` naming the source, raised within seconds: a hub id
that is neither cached nor reachable is refused after a 3 s connection probe instead of
transformers' own retries.
"""

from __future__ import annotations

import difflib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.key_values import parse_key_values
from tpu_tuner.core.user_paths import expand_user

if TYPE_CHECKING:
    from transformers import PretrainedConfig

PREFIX = "hf:"
TASKS = ("causal-lm", "masked-lm", "seq2seq", "classification")
OPTIONS = ("inference", "weights", "task")
INSTALL_HINT = "Hugging Face models need the transformers package: pip install 'tpu-tune[hf]'"
HUB_PROBE_TIMEOUT_S = 3.0
# How alike (difflib's ratio) a name must be to be suggested: 'lama' is 0.89 to 'llama', 'lamma'
# 0.80; difflib's own 0.6 suggested 'voxtral_realtime_text' for 'not_a_real_model_type' (0.62),
# among 400-odd model types something always reaches it.
CLOSE_RATIO = 0.8

Kind = Literal["directory", "hub", "type"]


@dataclass(frozen=True)
class HfSource:
    """What an ``hf:`` source names: the config's origin, its overrides and the workload options."""

    text: str  # the source as written (the workload's path in every process)
    kind: Kind
    location: str  # the folder, the hub id or the model type
    overrides: dict[str, Any] = field(default_factory=dict)
    inference: bool = False
    weights: bool = False
    task: str | None = None  # None: the head the config declares (causal LM first)

    @property
    def name(self) -> str:
        """A short name for run folders and reports: the folder's or repository's last part, or
        the model type."""
        if self.kind == "type":
            return self.location
        return Path(self.location.rstrip("/")).name or self.location

    def with_options(self, inference: bool = False, weights: bool = False) -> str:
        """The source text with these workload options added (what the CLI passes on)."""
        options = [o for o in self.text.partition("#")[2].split(",") if o]
        options += [o for o, on in (("inference", inference), ("weights", weights)) if on and o not in options]
        return self.text.partition("#")[0] + ("#" + ",".join(options) if options else "")


def is_hf_source(path: str | Path) -> bool:
    """Whether `path` names a Hugging Face model (``hf:...``)."""
    return str(path).startswith(PREFIX)


def parse(text: str | Path) -> HfSource:
    """Split an ``hf:`` source into its parts; a malformed one is a one-line `UserInputError`."""
    text = str(text)
    body, _, fragment = text[len(PREFIX) :].partition("#")
    location, _, query = body.partition("?")
    if not location:
        raise UserInputError("hf: needs a config folder, a hub id or a model type after it", text)
    options = _options(fragment, text)
    kind: Kind
    if location.startswith((".", "/", "~")) or expand_user(location).is_dir():
        kind = "directory"
    elif "/" in location:
        kind = "hub"
    else:
        kind = "type"
    return HfSource(
        text=text,
        kind=kind,
        location=location,
        overrides=parse_key_values(query, text),
        inference=bool(options.get("inference")),
        weights=bool(options.get("weights")),
        task=options.get("task"),
    )


def _options(fragment: str, text: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in filter(None, fragment.split(",")):
        key, sep, value = item.partition("=")
        if key not in OPTIONS:
            raise UserInputError(f"unknown option {key!r} after '#'; known: {', '.join(OPTIONS)}", text)
        if key == "task":
            if value not in TASKS:
                raise UserInputError(f"task {value!r} is not one of {', '.join(TASKS)}", text)
            options[key] = value
        else:
            options[key] = True if not sep else value.lower() in ("1", "true", "yes")
    if options.get("weights") and options.get("task") is not None:
        raise UserInputError("--weights loads the head the checkpoint was saved with; drop task=", text)
    return options


def load_config(source: HfSource) -> PretrainedConfig:
    """The transformers config `source` names, overrides applied (`UserInputError` otherwise)."""
    try:
        import transformers
    except ImportError as exc:
        raise UserInputError(INSTALL_HINT, source.text) from exc
    transformers.logging.set_verbosity_error()  # its config warnings would reach the user's terminal
    if source.kind == "type":
        return _config_for_type(source, transformers)
    if source.kind == "directory":
        return _from_pretrained(transformers, str(check_folder(source)), source, local_only=True)
    return _hub_config(source, transformers)


def check_folder(source: HfSource) -> Path:
    """The folder a ``directory`` source names, once it is there with a config.json
    (`UserInputError` otherwise). Needs no transformers: the CLI runs it before importing that."""
    folder = expand_user(source.location, source.text)
    if not folder.is_dir():
        raise UserInputError(f"no such folder: {folder}", source.text)
    if not (folder / "config.json").is_file():
        raise UserInputError(f"no config.json in {folder}", source.text)
    return folder


def _config_for_type(source: HfSource, transformers: Any) -> PretrainedConfig:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if source.location not in CONFIG_MAPPING_NAMES:
        hint = _did_you_mean(source.location.lower(), list(CONFIG_MAPPING_NAMES))
        raise UserInputError(f"unknown transformers model type {source.location!r}{hint}", source.text)
    try:
        default = transformers.AutoConfig.for_model(source.location)
        _check_keys(default, source.overrides, source)
        # Overrides go through the config's constructor, so what it derives (a head dimension
        # from the width and the heads) follows them.
        return transformers.AutoConfig.for_model(source.location, **source.overrides)
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"cannot make a {source.location} config: {_one_line(exc)}", source.text) from exc


def _check_keys(config: PretrainedConfig, overrides: dict[str, Any], source: HfSource) -> None:
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    for key in overrides:
        if key not in known:
            hint = _did_you_mean(key, sorted(known), by_words=True)
            raise UserInputError(f"{type(config).__name__} has no setting {key!r}{hint}", source.text)


def _did_you_mean(word: str, names: list[str], by_words: bool = False) -> str:
    """'; did you mean a, b?' naming up to three of `names` close to `word`, or '' where none is.
    With `by_words`, a name holding the word's '_'-separated words in order is close too: a setting
    named short ('num_layers' for num_hidden_layers, 'vocab' for vocab_size)."""
    close = difflib.get_close_matches(word, names, n=3, cutoff=CLOSE_RATIO)
    if by_words and not close:
        close = [name for name in names if _holds_in_order(name.split("_"), word.split("_"))][:3]
    return f"; did you mean {', '.join(close)}?" if close else ""


def _holds_in_order(words: list[str], wanted: list[str]) -> bool:
    remaining = iter(words)
    return all(any(word == want for word in remaining) for want in wanted)


def _hub_config(source: HfSource, transformers: Any) -> PretrainedConfig:
    try:
        return _from_pretrained(transformers, source.location, source, local_only=True)
    except UserInputError as exc:
        if not str(exc).split(": ", 1)[-1].startswith("cannot read the config"):
            raise  # read from the cache; the overrides are what is wrong
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserInputError(
            f"{source.location} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set", source.text
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    reason = _unreachable(endpoint)
    if reason:
        raise UserInputError(
            f"{source.location} is not in the local Hugging Face cache and {endpoint} cannot be "
            f"reached ({reason}); put its config.json in a folder and pass hf:./that-folder",
            source.text,
        )
    return _from_pretrained(transformers, source.location, source, local_only=False)


def _unreachable(endpoint: str) -> str | None:
    """Why the hub at `endpoint` cannot be reached within a few seconds, or None."""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _from_pretrained(transformers: Any, location: str, source: HfSource, local_only: bool) -> PretrainedConfig:
    try:
        config = transformers.AutoConfig.from_pretrained(location, local_files_only=local_only)
    except Exception as exc:
        raise UserInputError(f"cannot read the config of {location}: {_one_line(exc)}", source.text) from exc
    if not source.overrides:
        return config
    _check_keys(config, source.overrides, source)
    values = {**config.to_dict(), **source.overrides}
    layers, pattern = source.overrides.get("num_hidden_layers"), values.get("layer_types")
    if isinstance(layers, int) and isinstance(pattern, list) and pattern and "layer_types" not in source.overrides:
        # A published per-layer pattern (Gemma 2's sliding / full attention) follows the new depth.
        values["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    try:
        return type(config).from_dict(values)
    except Exception as exc:
        raise UserInputError(f"the overrides make an invalid config: {_one_line(exc)}", source.text) from exc


def config_bytes(text: str) -> bytes:
    """The bytes of the config.json a folder source reads (empty for hub ids and model types,
    whose config the source text and the transformers version name)."""
    source = parse(text)
    if source.kind != "directory":
        return b""
    file = expand_user(source.location, text) / "config.json"
    return file.read_bytes() if file.is_file() else b""


def _one_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text[:300] if text else type(exc).__name__


__all__ = [
    "HfSource",
    "INSTALL_HINT",
    "PREFIX",
    "TASKS",
    "check_folder",
    "config_bytes",
    "is_hf_source",
    "load_config",
    "parse",
]
