"""What a provider plugin can do, checked once when the registry loads it.

The five verbs are :class:`~gpulayer.cloud.protocol.Provider`; every optional ability is a
runtime-checkable protocol (a plugin declares it by inheriting it) or a mixin. The orchestrator
asks ``isinstance(provider, Ability)`` where it needs one. A runtime protocol only checks that
the names exist, so here each method a plugin has of a protocol it is an instance of is held to
the protocol's parameters: a plugin that declares an ability it implements wrongly is refused
when loaded, in one line, instead of failing on the first gang or listing that calls it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from gpulayer.cloud.catalogs import CatalogProvider, CatalogRefresher, NamesRegions
from gpulayer.cloud.credentials import ReadsCredentials
from gpulayer.cloud.errors import ProviderNotInstalled
from gpulayer.cloud.protocol import (
    FinishingProvider,
    GangProvider,
    OffersAreMachines,
    OutlivesReclaim,
    Provider,
)

ABILITIES: tuple[type, ...] = (
    Provider,
    GangProvider,
    FinishingProvider,
    CatalogProvider,
    CatalogRefresher,
    NamesRegions,
    ReadsCredentials,
)
"""Protocols whose methods a plugin's are checked against."""

_MARKERS: dict[str, type] = {
    "offers_are_machines": OffersAreMachines,
    "machines_outlive_reclaim": OutlivesReclaim,
}
"""Class attributes that once declared an ability and now decide nothing: the mixin does."""


class ProviderContractError(ProviderNotInstalled):
    """A plugin is not what it declares (an ability's method missing or of another shape)."""


_passed: set[type] = set()
"""Classes already checked and found to be what they declare: a check is once per class."""


def check_plugin_class(cls: type, where: str) -> None:
    """Raise ProviderContractError when ``cls`` declares (inherits) an ability without
    implementing it, or has an ability's methods with parameters the protocol's callers do
    not pass. ``where`` names the plugin in the error (its entry point)."""
    if cls in _passed:
        return
    _check(cls, where)
    _passed.add(cls)


def _check(cls: type, where: str) -> None:
    mro = inspect.getmro(cls)
    for ability in ABILITIES:
        declared = ability in mro
        if not declared and not all(_defined(mro, name) for name in _methods(ability)):
            continue  # neither declared nor an instance of it: the ability is not claimed
        for name, wanted in _methods(ability).items():
            problem = _problem(mro, name, wanted)
            if problem:
                raise ProviderContractError(f"{where}: as a {ability.__name__}, {problem}")
    for attribute, mixin in _MARKERS.items():
        if any(attribute in vars(c) for c in mro) and mixin not in mro:
            raise ProviderContractError(
                f"{where}: the attribute {attribute} decides nothing; "
                f"inherit gpulayer.cloud.{mixin.__name__} instead"
            )


def _methods(protocol: type) -> dict[str, Callable[..., Any]]:
    """The methods a protocol asks for, its bases' included (Protocol's own are not)."""
    found: dict[str, Callable[..., Any]] = {}
    for base in reversed(inspect.getmro(protocol)):
        if base is not protocol and not _is_protocol(base):
            continue
        found.update((n, v) for n, v in vars(base).items() if inspect.isfunction(v))
    return {n: v for n, v in found.items() if not n.startswith("_")}


def _is_protocol(cls: type) -> bool:
    return bool(vars(cls).get("_is_protocol", False)) and cls.__module__ != "typing"


def _owner(mro: tuple[type, ...], name: str) -> type | None:
    return next((c for c in mro if name in vars(c)), None)


def _defined(mro: tuple[type, ...], name: str) -> bool:
    owner = _owner(mro, name)
    return owner is not None and not _is_protocol(owner)


def _problem(mro: tuple[type, ...], name: str, wanted: Callable[..., Any]) -> str | None:
    owner = _owner(mro, name)
    if owner is None or _is_protocol(owner):
        return f"it does not define {name}"
    found = vars(owner)[name]
    if isinstance(found, staticmethod | classmethod):
        return f"{name} must be a plain method"
    if not callable(found):
        return f"{name} is not a method"
    try:
        have = inspect.signature(found)
    except (TypeError, ValueError):
        return None  # a builtin or C callable: nothing to compare with
    want = inspect.signature(wanted)
    if not _accepts(have, want):
        return f"{name}{_shape(have)} does not take {name}{_shape(want)}"
    return None


def _accepts(have: inspect.Signature, want: inspect.Signature) -> bool:
    """Whether every call the protocol allows binds to ``have``."""
    kinds = inspect.Parameter
    have_params = list(have.parameters.values())
    have_positional = [
        p for p in have_params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is kinds.VAR_POSITIONAL for p in have_params)
    varkw = any(p.kind is kinds.VAR_KEYWORD for p in have_params)
    by_name = {
        p.name: p
        for p in have_params
        if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
    }
    matched: set[str] = set()
    index = 0
    for param in want.parameters.values():
        if param.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD):
            if index < len(have_positional):
                theirs = have_positional[index]
                matched.add(theirs.name)
                if param.default is not kinds.empty and theirs.default is kinds.empty:
                    return False  # callers may leave it out
            elif not varargs:
                return False
            index += 1
        elif param.kind is kinds.KEYWORD_ONLY:
            theirs_kw = by_name.get(param.name)
            if theirs_kw is None:
                if not varkw:
                    return False
                continue
            matched.add(theirs_kw.name)
            if param.default is not kinds.empty and theirs_kw.default is kinds.empty:
                return False
    # A parameter of theirs that callers never pass must have a default.
    return all(
        p.name in matched
        or p.default is not kinds.empty
        or p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        for p in have_params
    )


def _shape(signature: inspect.Signature) -> str:
    """``(offer, request)``: the parameters' names as a caller sees them."""
    return "(" + ", ".join(_parts(signature)) + ")"


def _parts(signature: inspect.Signature) -> Iterator[str]:
    star = False
    for param in signature.parameters.values():
        if param.name == "self":
            continue
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            star = True
            yield "*"
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            star = True
            yield f"*{param.name}"
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            yield f"**{param.name}"
        else:
            yield param.name + ("=..." if param.default is not inspect.Parameter.empty else "")
