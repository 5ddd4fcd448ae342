"""The option mechanism: a frozen dataclass of `option(...)` fields becomes flags and TRAINER_* variables.

Each field is a command-line flag (`--per-worker-batch-size`) and an environment variable
(`TRAINER_PER_WORKER_BATCH_SIZE`), so a pod spec can set it without editing args. Precedence: flag, then
environment, then the default. A field's type is its real annotation: bool, int, float or str; any other type is
refused when the parser is built, so a list or optional field can never silently arrive as a string.

The core's knobs (config.py), each dataset kind's and each task's options are such dataclasses; the parser
(flags.py) gathers them. A field may bound its value (`at_least`, `below`) beside its choices. `Registry` is the
name -> builder table behind --task, --dataset and --model. This module imports nothing of the trainer but its
errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from trainer.base.errors import ConfigError, UserError

ENV_PREFIX = "TRAINER_"
OPTION_TYPES = (bool, int, float, str)

Builder = TypeVar("Builder", bound=Callable[..., Any])


class Registry(dict[str, Builder], Generic[Builder]):
    def register(self, name: str) -> Callable[[Builder], Builder]:
        """A decorator: @register("name") puts the builder under that name and returns it unchanged."""

        def add(builder: Builder) -> Builder:
            self[name] = builder
            return builder

        return add


def import_registering_module(module: str, flag: str, error: type[UserError] = ConfigError) -> None:
    """Imports the module a flag names, which fills the registries (its tasks, its datasets and their options);
    raises `error`, naming the flag and the fix, when it cannot be imported."""
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as cause:
        raise error(
            f"{flag} {module}: cannot import it ({cause}); put its directory on PYTHONPATH or install it in the "
            f"trainer's environment"
        ) from None


def option(
    default: Any,
    help: str,
    choices: Sequence[str] | None = None,
    at_least: float | None = None,
    below: float | None = None,
    hidden: bool = False,
) -> Any:
    """A field of an option dataclass: its default, its --help text and, for a str, its choices; for a number, the
    least value it takes and the one it stays below, where it has them (checked with the choices). hidden: an older
    name that keeps working, left out of --help."""
    bounds = {"at_least": at_least, "below": below}
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "hidden": hidden, **bounds})


def option_fields(options_class: type) -> list[dataclasses.Field]:
    """The fields of an option dataclass that are options (flags and variables)."""
    return [field for field in dataclasses.fields(options_class) if field.metadata.get("help")]


def option_type(options_class: type, field: dataclasses.Field) -> type:
    """The field's real type (annotations are strings under `from __future__ import annotations`); TypeError for
    a type the flags and variables cannot carry, raised when the parser is built, never at a user's run."""
    kind = typing.get_type_hints(options_class)[field.name]
    if kind not in OPTION_TYPES:
        raise TypeError(
            f"option {options_class.__qualname__}.{field.name} has type {kind}; options are "
            f"{', '.join(t.__name__ for t in OPTION_TYPES)} (a list can be a comma-separated str)"
        )
    return kind


def flag(name: str) -> str:
    """The flag of a field, without its dashes: per_worker_batch_size -> per-worker-batch-size."""
    return name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def option_variables(options_class: type) -> set[str]:
    """The TRAINER_* variables of an option dataclass's options."""
    return {env_name(field.name) for field in option_fields(options_class)}


def refuse_unknown_variables(
    environ: Mapping[str, str],
    options_classes: Sequence[type],
    read_elsewhere: Sequence[str] = (),
    unchosen: Mapping[str, str] | None = None,
) -> None:
    """ConfigError naming each non-empty TRAINER_* variable that is no option of these classes, nor read_elsewhere:
    a misspelt variable would otherwise be silently ignored. Each is named with what it likely is: an option of an
    option group this run does not use (`unchosen`: variable -> that group, say "task regression"), or one of this
    run's options spelt differently."""
    known = {variable for options_class in options_classes for variable in option_variables(options_class)}
    known.update(read_elsewhere)
    unknown = [
        name
        for name, value in sorted(environ.items())
        if name.startswith(ENV_PREFIX) and value and name not in known and not _service_link(name, environ)
    ]
    if not unknown:
        return
    # Compared without the prefix every name shares, which would make any two look alike.
    suffixes = [variable.removeprefix(ENV_PREFIX) for variable in sorted(known)]
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1, cutoff=0.8)
        if unchosen and name in unchosen:
            named.append(f"{name} (an option of {unchosen[name]}, which this run does not use)")
        else:
            named.append(f"{name} (did you mean {ENV_PREFIX}{close[0]}?)" if close else name)
    raise ConfigError(
        f"{', '.join(named)}: no option of this run has such a name; correct or remove it where it is set "
        "(k8s/base/trainer.env, your environment, the pod's env), or choose what it belongs to (an option of your "
        "module's task or dataset needs --module, TRAINER_MODULE). `python -m trainer --help` shows each option's "
        f"variable as [env {ENV_PREFIX}...]"
    )


# The variables the kubelet gives a pod for each Service in its namespace (<SERVICE> the name in capitals, `-` as
# `_`): <SERVICE>_SERVICE_HOST, _SERVICE_PORT[_<PORT NAME>], _PORT, _PORT_<port>_<PROTOCOL>[_PROTO|_PORT|_ADDR].
_SERVICE_LINK = re.compile(r"(SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)")


def _service_link(name: str, environ: Mapping[str, str]) -> bool:
    """Whether the kubelet wrote it: a Service named trainer-... in the pod's namespace gives it TRAINER_... ones."""
    for host in (key for key in environ if key.endswith("_SERVICE_HOST")):
        service = host.removesuffix("_SERVICE_HOST")
        if name == host or (name.startswith(f"{service}_") and _SERVICE_LINK.fullmatch(name[len(service) + 1 :])):
            return True
    return False


def check_values(options: Any) -> None:
    """Refuses a value outside its option's choices (a variable's value never went through argparse's check) or
    bounds."""
    for field in option_fields(type(options)):
        value, choices = getattr(options, field.name), field.metadata["choices"]
        at_least, below = field.metadata.get("at_least"), field.metadata.get("below")
        if choices and value not in choices:
            raise ConfigError(f"--{flag(field.name)}: unknown value {value!r}; choose one of {', '.join(choices)}")
        if at_least is not None and below is not None and not at_least <= value < below:
            raise ConfigError(f"--{flag(field.name)} must be in [{at_least}, {below}), got {value}")
        if at_least is not None and value < at_least:
            raise ConfigError(f"--{flag(field.name)} must be at least {at_least}, got {value}")


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options_class: type, environ: dict[str, str]
) -> None:
    """One flag per option of options_class, its default read from environ's TRAINER_* variable if set."""
    for field in option_fields(options_class):
        kind = option_type(options_class, field)
        default = _from_env(field, kind, environ)
        shown = f"{field.metadata['help']} [env {env_name(field.name)}]"
        help_text = argparse.SUPPRESS if field.metadata.get("hidden") else shown
        if kind is bool:
            parser.add_argument(
                f"--{flag(field.name)}", action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        else:
            parser.add_argument(
                f"--{flag(field.name)}", type=kind, default=default, choices=field.metadata["choices"], help=help_text
            )


def take_options(args: dict[str, Any], options_class: type) -> Any:
    """An instance of options_class from parsed flags, its values popped from args."""
    return options_class(**{field.name: args.pop(field.name) for field in option_fields(options_class)})


def _parse_bool(text: str, source: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{source}: expected true/false (or 1/0), got {text!r}")


def _from_env(field: dataclasses.Field, kind: type, environ: dict[str, str]) -> Any:
    env = env_name(field.name)
    # Empty is unset: k8s/base/trainer.env leaves the optional data settings empty, and the manifests carry them.
    if not environ.get(env):
        return field.default
    text = environ[env]
    if kind is bool:
        return _parse_bool(text, env)
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{env}: expected {kind.__name__}, got {text!r}") from None
