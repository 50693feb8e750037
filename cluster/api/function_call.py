"""A Python function's call as a job's program (``cluster.submit(fn, ...)``), packed once for
``submit``, ``dry_run`` and ``sweep``: its keywords told from the spec's overrides, its
arguments bound to its signature, and everything that must travel to the ranks (the function,
its arguments, the globals and closure it uses) picklable, checked before anything is written
or launched. Each refusal is a ``ConfigError`` naming the argument, key or global."""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from cluster.spec import JobSpec
from train.contract.config import describe
from train.contract.errors import ConfigError


def name_of(fn: Callable) -> str:
    return f"{getattr(fn, '__qualname__', None) or type(fn).__name__}()"


def parameters(fn: Callable) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: every keyword is the spec's
        return []


def split_keywords(fn: Callable, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keywords that name one of ``fn``'s parameters, the spec's overrides)."""
    names = set(parameters(fn))
    return {k: v for k, v in values.items() if k in names}, {k: v for k, v in values.items() if k not in names}


def bind(fn: Callable, args: tuple, arguments: dict[str, Any], swept: list[str] = ()) -> None:
    """``fn(*args, **arguments)`` as Python would bind it (``swept``: arguments each point of a
    sweep gives): a missing, extra or doubled argument is refused here, not on every rank."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **arguments, **dict.fromkeys(swept))
    except TypeError as exc:
        raise ConfigError(name_of(fn), f"{exc} (its signature: {signature})") from None


def is_spec_key(key: str) -> bool:
    """``key`` names a key of the job spec, or a section of one, or a key under one."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k, _, _ in describe(JobSpec))


def check_keywords(fn: Callable, spec_values: list[str]) -> None:
    """A keyword given with a function that is neither one of its parameters nor a key of the
    job spec is named, with the nearest of both."""
    spec_keys = [key for key, _, _ in describe(JobSpec)]
    for key in spec_values:
        if not is_spec_key(key):
            close = difflib.get_close_matches(key, [*parameters(fn), *spec_keys], n=1, cutoff=0.5)
            raise ConfigError(
                key,
                f"neither a parameter of {name_of(fn)} ({', '.join(parameters(fn)) or 'none'}) nor a key of the job "
                "spec" + (f" (did you mean {close[0]!r}?)" if close else ""),
            )


def check_travels(fn: Callable, args: tuple, arguments: dict[str, Any]) -> None:
    """Everything the ranks get must pickle (cloudpickle, submitit's pickler): the argument, or
    the global or closure variable of ``fn``, that cannot is named."""
    import cloudpickle  # lazy, as submitit's: only a function's job pickles

    def fails(value: Any) -> str | None:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError ...
            return f"{type(exc).__name__}: {exc}"
        return None

    if (whole := fails((fn, args, arguments))) is None:
        return
    try:
        bound = inspect.signature(fn).bind_partial(*args, **arguments).arguments
    except (TypeError, ValueError):
        bound = {**{f"argument {i}": v for i, v in enumerate(args)}, **arguments}
    parts = [(key, f"{name_of(fn)}'s argument {key!r}", value) for key, value in bound.items()]
    try:
        found = inspect.getclosurevars(fn)
        parts += [(k, f"the global {k!r} that {name_of(fn)} uses", v) for k, v in found.globals.items()]
        parts += [(k, f"the variable {k!r} that {name_of(fn)} closes over", v) for k, v in found.nonlocals.items()]
    except TypeError:  # not a Python function: a callable object
        pass
    parts.append((name_of(fn), f"the function {name_of(fn)}", fn))
    for key, what, value in parts:
        if (why := fails(value)) is not None:
            raise ConfigError(key, f"{what} cannot travel to the ranks: it does not pickle ({why}); "
                                   "make it inside the function, or pass what it is made from")  # fmt: skip
    raise ConfigError(name_of(fn), f"what the ranks get does not pickle ({whole})")


def code_file(fn: Callable) -> str | None:
    """Where ``fn`` was written: cloudpickle ships a function of ``__main__`` or a notebook by
    value and names its code "<dynamic-code>"; ``train.rank.function_program`` gives the name back, so a
    rank's traceback shows the real file and line."""
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else None


def split_call(fn: Callable, values: dict[str, Any], overrides: dict[str, Any] | None) -> tuple[dict, dict]:
    """(``fn``'s keyword arguments, the spec's overrides). Given ``overrides`` (the explicit
    form, as submitit's ``update_parameters`` keeps resources apart), every keyword is ``fn``'s.
    Without it, the old form, for one release: a keyword that names one of ``fn``'s parameters
    is its argument, any other the spec's, each with a ``FutureWarning`` where it may be misread."""
    if overrides is not None:
        return dict(values), dict(overrides)
    given, spec_values = split_keywords(fn, values)
    check_keywords(fn, list(spec_values))
    if spec_values:
        warnings.warn(
            f"{', '.join(spec_values)}: read as the job spec's, not {name_of(fn)}'s; pass the spec's keys as "
            "overrides={...} (in a later release every keyword is the function's)",
            FutureWarning,
            stacklevel=3,
        )
    both = [k for k in given if is_spec_key(k)]
    if both:
        warnings.warn(
            f"{', '.join(both)}: {name_of(fn)}'s own argument, also a key of the job spec; a spec's key goes in "
            "overrides={...}",
            FutureWarning,
            stacklevel=3,
        )
    return given, spec_values


def packed(fn: Callable, args: tuple, arguments: dict[str, Any], swept: list[str] = ()):
    """``fn(*args, **arguments)`` checked (bound, picklable) and packed as submitit packs a call
    (``swept``: the arguments each point of a sweep adds)."""
    bind(fn, args, arguments, swept)
    check_travels(fn, args, arguments)
    from submitit.helpers import DelayedSubmission  # lazy: 45 ms that only a function's job needs

    delayed = DelayedSubmission(fn, *args, **arguments)
    delayed.code_file = code_file(fn)  # train.rank.function_program names the code where it was written
    return delayed
