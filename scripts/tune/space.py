"""The search space: one YAML file (scripts/tune/search_space.yaml is the example) that `make tune` searches with
Optuna. Every parameter is a trainer flag, the core's, a dataset kind's or the task's, and is checked against the
trainer's own options before any trial runs: its type, its choices and, through the trainer's parser, its bounds at
both ends of a range and at every listed value. A problem is a SpaceError (exit 2) naming the file, the parameter,
the option's bounds and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from trainer.base.errors import ConfigError, DataError, UserError
from trainer.data import catalog
from trainer.settings.config import Config
from trainer.settings.options import flag, option_fields, option_type
from trainer.task import Objective, find

SAMPLERS = ("tpe", "random", "grid")
KINDS = ("float", "int", "categorical")
# What each trial's job sets, or what selection compares trials by: a search over them would break either.
NOT_SEARCHED = {
    "model-dir": "each trial's job sets its own",
    "status-port": "each trial's job sets its own",
    "status-host": "each trial's job sets its own",
    "epochs": "set EPOCHS= for every trial; pruning stops poor trials early",
    "dataset": "set DATASET= for every trial",
    "task": "trials are compared on one task's objective",
    "module": "trials are compared on one task's objective",
    "task-module": "trials are compared on one task's objective",
    "dataset-module": "trials are compared on one test split",
    "test-files": "trials are compared on one test split",
    "test-examples": "trials are compared on one test split",
    "seed": "a generated dataset's test split follows the seed, and trials are compared on one test split",
    "validation-split": "trials are compared on one test split",
    "image-dir": "trials are compared on one test split",
}
SEED_RANGE = 2**32  # what Optuna's samplers (numpy's RandomState) take
TOP_KEYS = ("objective", "trials", "parallel", "sampler", "seed", "prune", "parameters")


class SpaceError(UserError):
    """The search space cannot be searched; the message names the file, the parameter and the fix."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str  # the trainer flag without its dashes: learning-rate
    kind: str  # float, int or categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    values: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The trial's value (an optuna.Trial's suggest_*)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.values))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def grid(self) -> list[Any]:
        """Every value of the parameter, for the grid sampler."""
        if self.kind == "categorical":
            return list(self.values)
        if self.kind == "int" and not self.log:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise SpaceError(
            f"{self.name}: the grid sampler takes listed values only; give it `type: categorical` and `values: "
            f"[...]`, or use sampler: tpe or random"
        )


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    path: str
    objective: Objective
    trials: int
    parallel: int
    sampler: str
    seed: int | None
    prune: bool
    parameters: tuple[Parameter, ...]

    @property
    def direction(self) -> str:
        return "maximize" if self.objective.higher_is_better else "minimize"

    @property
    def digest(self) -> str:
        """What the study was made from: a resumed study must search the same space toward the same objective."""
        searched = [dataclasses.asdict(parameter) for parameter in self.parameters]
        text = json.dumps([self.objective.key, self.objective.higher_is_better, self.sampler, searched], default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the parameters' values (the grid sampler's trials)."""
        names = [parameter.name for parameter in self.parameters]
        return [
            dict(zip(names, values, strict=True)) for values in itertools.product(*(p.grid() for p in self.parameters))
        ]

    def suggest(self, trial: Any) -> dict[str, Any]:
        return {parameter.name: parameter.suggest(trial) for parameter in self.parameters}


def trainer_flags(values: Mapping[str, Any]) -> list[str]:
    """The trainer's command line for one trial's values: --name value, --name / --no-name for a bool."""
    argv = []
    for name, value in values.items():
        if isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        else:
            argv += [f"--{name}", repr(value) if isinstance(value, float) else str(value)]
    return argv


def load(
    path: str | pathlib.Path,
    trainer_argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    data_here: bool = False,
) -> SearchSpace:
    """The file's search space, checked against the options the trainer has with trainer_argv (the flags every trial
    gets: ARGS, --dataset, --epochs, --image-dir). data_here: the trials read their data on this machine (make tune,
    not tune-cluster), so the dataset's own flags are checked against it too."""
    from trainer.context import parse_config  # the trainer's own reading of its flags, the task's options included

    where = str(path)
    try:
        text = pathlib.Path(path).read_text()
    except OSError as error:
        raise SpaceError(
            f"search space {where}: cannot read it ({error.strerror}); SEARCH_SPACE= names the file"
        ) from None
    except UnicodeDecodeError:
        raise SpaceError(f"search space {where}: not UTF-8 text; SEARCH_SPACE= names a YAML file") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpaceError(f"search space {where}: not YAML ({error})") from None
    if not isinstance(document, dict):
        raise SpaceError(f"search space {where}: expected a mapping with parameters:, got {type(document).__name__}")
    unknown = sorted(str(key) for key in document if key not in TOP_KEYS)
    if unknown:
        raise SpaceError(
            f"search space {where}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(TOP_KEYS)}"
        )
    try:
        base = parse_config(list(trainer_argv), dict(environ) if environ is not None else None)
        if data_here:  # without the dataset's own flags (image_folder's --image-dir) every trial would fail alike
            catalog.check_dataset(base)
    except (ConfigError, DataError) as error:
        raise SpaceError(f"the trainer refuses the flags every trial gets: {error}") from None
    options = _options_of(base)
    given = _given_options(trainer_argv, options)
    raw = document.get("parameters")
    if not isinstance(raw, dict) or not raw:
        raise SpaceError(f"search space {where}: parameters: must map each trainer flag to its range or values")
    parameters = []
    for name, spec in raw.items():
        parameter = _parameter(where, str(name), spec, options)
        if parameter.name in given:
            raise SpaceError(
                f"search space {where}: {parameter.name} is searched and also given in ARGS (--{parameter.name}); "
                f"remove it from one of them"
            )
        for value in _checked_values(parameter):
            _check_with_trainer(where, parameter, value, trainer_argv, environ)
        parameters.append(parameter)
    objective = find(base.task, base.task_module).objective
    declared = document.get("objective", objective.key)
    if declared != objective.key:
        raise SpaceError(
            f"search space {where}: objective {declared!r}, but the task {base.task} is judged by {objective.key} "
            f"({'higher' if objective.higher_is_better else 'lower'} is better), as selection publishes by it; write "
            f"objective: {objective.key}, or change the task's objective"
        )
    sampler = document.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise SpaceError(f"search space {where}: sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    seed = document.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_RANGE):
        raise SpaceError(f"search space {where}: seed must be a whole number from 0 to {SEED_RANGE - 1}, got {seed!r}")
    space = SearchSpace(
        path=where,
        objective=objective,
        trials=_count(where, document, "trials", 8),
        parallel=_count(where, document, "parallel", 1),
        sampler=sampler,
        seed=seed,
        prune=_switch(where, "prune", document.get("prune", True)),
        parameters=tuple(parameters),
    )
    if sampler == "grid":
        try:
            [parameter.grid() for parameter in parameters]
        except SpaceError as error:
            raise SpaceError(f"search space {where}: {error}") from None
    return space


def _switch(where: str, key: str, value: Any) -> bool:
    """A yes/no key: YAML's true or false only (the text 'false' is not false)."""
    if not isinstance(value, bool):
        raise SpaceError(f"search space {where}: {key} must be true or false, got {value!r}")
    return value


def _given_options(trainer_argv: Sequence[str], options: Mapping[str, Any]) -> set[str]:
    """The options ARGS sets, by their full flag: the trainer's parser also takes a unique prefix (--warmup)."""
    given = set()
    for arg in trainer_argv:
        if not arg.startswith("--"):
            continue
        name = arg.split("=")[0][2:]
        name = name if name in options else name.removeprefix("no-")
        prefixed = [option for option in options if option.startswith(name)]
        given.add(name if name in options or len(prefixed) != 1 else prefixed[0])
    return given


def _options_of(config: Config) -> dict[str, tuple[type, dataclasses.Field, type]]:
    """Every option the trainer has with this config: flag name -> (its group's class, its field, its type)."""
    options = {}
    for options_class in (Config, *(type(group) for group in config.groups)):
        for field in option_fields(options_class):
            options[flag(field.name)] = (options_class, field, option_type(options_class, field))
    return options


def _number(where: str, name: str, key: str, value: Any) -> float:
    """A bound as a number; YAML 1.1 reads 1e-4 (no dot) as text, so numeric text counts too."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpaceError(f"search space {where}: {name}'s {key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or isinstance(value, bool):
        raise SpaceError(f"search space {where}: {name}'s {key} must be a finite number, got {value!r}")
    return number


def _parameter(where: str, name: str, spec: Any, options: Mapping[str, tuple[type, Any, type]]) -> Parameter:
    if "_" in name and name.replace("_", "-") in options:
        raise SpaceError(f"search space {where}: {name}: name parameters by their flag, {name.replace('_', '-')}")
    if name in NOT_SEARCHED:
        raise SpaceError(f"search space {where}: {name} cannot be searched: {NOT_SEARCHED[name]}")
    if name not in options:
        raise SpaceError(
            f"search space {where}: {name} is not an option of the trainer (its core, its dataset kinds or the "
            f"task's); `python -m trainer --help` lists them, by flag"
        )
    _, field, kind = options[name]
    if not isinstance(spec, dict):
        raise SpaceError(
            f"search space {where}: {name}: expected {{type: ..., min: ..., max: ...}} or "
            f"{{type: categorical, values: [...]}}"
        )
    parameter_kind = spec.get("type")
    if parameter_kind not in KINDS:
        raise SpaceError(f"search space {where}: {name}: type {parameter_kind!r}; choose one of {', '.join(KINDS)}")
    described = _described(field, kind)
    if parameter_kind == "categorical":
        unknown = sorted(str(key) for key in spec if key not in ("type", "values"))
        if unknown:
            raise SpaceError(
                f"search space {where}: {name}: unknown key(s) {', '.join(unknown)}; a categorical parameter has values"
            )
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise SpaceError(f"search space {where}: {name}: a categorical parameter lists its values: values: [...]")
        if kind is float:  # YAML 1.1 reads 1e-3 (no dot) as text, as for a range's bounds
            values = [float(value) if _numeric_text(value) else value for value in values]
        for value in values:
            if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
                continue
            if type(value) is not kind:
                raise SpaceError(
                    f"search space {where}: {name}: value {value!r} is {_a(type(value).__name__)}, but --{name} takes "
                    f"{described}"
                )
            if field.metadata["choices"] and value not in field.metadata["choices"]:
                raise SpaceError(f"search space {where}: {name}: value {value!r} is not one of {described}")
        return Parameter(name, "categorical", values=tuple(float(v) if kind is float else v for v in values))
    if kind not in (int, float) or (parameter_kind == "float" and kind is int):
        raise SpaceError(
            f"search space {where}: {name}: a {parameter_kind} range, but --{name} takes {described}; "
            f"{'use type: int' if kind is int else 'list its values with type: categorical'}"
        )
    unknown = sorted(str(key) for key in spec if key not in ("type", "min", "max", "log", "step"))
    if unknown:
        raise SpaceError(
            f"search space {where}: {name}: unknown key(s) {', '.join(unknown)}; a range has min, max, log, step"
        )
    low, high = (_number(where, name, key, spec.get(key)) for key in ("min", "max"))
    if not low < high:
        raise SpaceError(f"search space {where}: {name}: min {low:g} must be below max {high:g}")
    log = _switch(where, f"{name}'s log", spec.get("log", False))
    step = _number(where, name, "step", spec["step"]) if spec.get("step") is not None else None
    if step is not None and step <= 0:
        raise SpaceError(f"search space {where}: {name}: step must be above 0, got {step:g}")
    if parameter_kind == "int" and not (low.is_integer() and high.is_integer() and (step is None or step.is_integer())):
        raise SpaceError(f"search space {where}: {name}: an int range has whole min, max and step")
    if log and step is not None:
        raise SpaceError(f"search space {where}: {name}: a range is either log or stepped, not both")
    if log and low <= 0:
        raise SpaceError(f"search space {where}: {name}: a log range starts above 0, got min {low:g}")
    return Parameter(name, parameter_kind, low=low, high=high, log=log, step=step)


def _numeric_text(value: Any) -> bool:
    """Text that reads as a number (YAML 1.1 leaves 1e-3 as text)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def _described(field: dataclasses.Field, kind: type) -> str:
    """What an option takes, in words: its type, its choices or its bounds."""
    choices = field.metadata["choices"]
    if choices:
        return f"one of {', '.join(map(str, choices))}"
    at_least, below = field.metadata.get("at_least"), field.metadata.get("below")
    bounds = ""
    if at_least is not None:
        bounds += f" of at least {at_least:g}"
    if below is not None:
        bounds += f"{' and' if bounds else ''} below {below:g}"
    return f"{'true or false' if kind is bool else _a(kind.__name__)}{bounds}"


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _checked_values(parameter: Parameter) -> list[Any]:
    """The values the trainer is asked about: both ends of a range, every listed value."""
    if parameter.kind == "categorical":
        return list(parameter.values)
    ends = [parameter.low, parameter.high]
    return [int(end) for end in ends] if parameter.kind == "int" else ends


def _check_with_trainer(
    where: str, parameter: Parameter, value: Any, trainer_argv: Sequence[str], environ: Mapping[str, str] | None
) -> None:
    """The trainer's own parser and validation on the value, so every bound it holds (in its options or its checks)
    holds here."""
    from trainer.context import parse_config

    try:
        parse_config(
            [*trainer_argv, *trainer_flags({parameter.name: value})], None if environ is None else dict(environ)
        )
    except ConfigError as error:
        raise SpaceError(
            f"search space {where}: {parameter.name} at {value!r}: the trainer refuses it: {error}"
        ) from None


def _count(where: str, document: Mapping[str, Any], key: str, default: int) -> int:
    value = document.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpaceError(f"search space {where}: {key} must be a whole number of at least 1, got {value!r}")
    return value
