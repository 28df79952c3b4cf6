"""Unlearning methods by name: ``@register`` a class, ``get_method(name, **hyperparameters)`` an
instance, ``available_methods(setting, kind)`` the names that apply (``--methods all``).

One name may be served by several classes with disjoint settings (``retrain`` is FedAvg
retraining in HFL, D-PSGD retraining in DFL, split-NN retraining in VFL): ``get_method`` picks
the class for the setting it is given."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from fedunlearn.certify.certificate import GUARANTEES
from fedunlearn.federation.forget_set import REQUEST_KINDS
from fedunlearn.unlearning.base import SETTINGS, UnlearningMethod

_METHODS: dict[str, list[type[UnlearningMethod]]] = {}

M = TypeVar("M", bound=type[UnlearningMethod])


def register(cls: M) -> M:
    """Class decorator: check the class declares a valid interface, then make it known by name."""
    for attribute in ("name", "settings", "request_kinds", "guarantee"):
        if not hasattr(cls, attribute):
            raise TypeError(f"{cls.__qualname__} must define the class attribute {attribute!r}")
    _check_subset(cls, "settings", cls.settings, SETTINGS)
    _check_subset(cls, "request_kinds", cls.request_kinds, REQUEST_KINDS)
    if cls.guarantee not in GUARANTEES:
        raise TypeError(f"{cls.__qualname__}: guarantee {cls.guarantee!r} is not one of {', '.join(GUARANTEES)}")
    # The same class seen again (a module reloaded) replaces itself; another class may share the
    # name only for other settings.
    same = (cls.__module__, cls.__qualname__)
    others = [k for k in _METHODS.get(cls.name, []) if (k.__module__, k.__qualname__) != same]
    for known in others:
        if set(known.settings) & set(cls.settings):
            raise ValueError(f"method name {cls.name!r} is already registered by {known.__qualname__} for "
                             f"settings {sorted(set(known.settings) & set(cls.settings))}")
    _METHODS[cls.name] = [*others, cls]
    return cls


def _check_subset(cls: type, attribute: str, values: frozenset[str], allowed: tuple[str, ...]) -> None:
    if not values or not set(values) <= set(allowed):
        raise TypeError(f"{cls.__qualname__}: {attribute} must be a non-empty subset of {allowed}, got {values}")


def get_method_class(name: str, setting: str | None = None) -> type[UnlearningMethod]:
    """The class serving ``name`` (in ``setting``, when several settings have their own class)."""
    if name not in _METHODS:
        raise ValueError(f"unknown unlearning method {name!r}; known methods: {', '.join(sorted(_METHODS))}")
    classes = _METHODS[name]
    if setting is not None:
        for cls in classes:
            if setting in cls.settings:
                return cls
        supported = sorted(s for cls in classes for s in cls.settings)
        raise ValueError(f"method {name!r} does not support setting {setting!r}; it supports: {', '.join(supported)}")
    if len(classes) > 1:
        raise ValueError(f"method {name!r} exists for several settings "
                         f"({', '.join(sorted(s for c in classes for s in c.settings))}); name the setting")
    return classes[0]


def get_method(name: str, *, setting: str | None = None, kind: str | None = None,
               **hyperparameters: Any) -> UnlearningMethod:
    """An instance of method ``name``. With ``setting`` and ``kind``, also checks up front that the
    method supports them, so a flow fails before it trains anything."""
    _check_choice("setting", setting, SETTINGS)
    cls = get_method_class(name, setting)
    _check_choice("kind", kind, REQUEST_KINDS)
    cls.check_supported(setting, kind)
    signature = inspect.signature(cls)
    try:
        signature.bind(**hyperparameters)
    except TypeError:
        accepted = list(signature.parameters)
        unknown = sorted(set(hyperparameters) - set(accepted))
        raise ValueError(f"method {name!r} has no hyperparameter(s) {unknown}; "
                         f"it accepts: {', '.join(accepted) or 'none'}") from None
    return cls(**hyperparameters)


def available_methods(setting: str | None = None, kind: str | None = None) -> list[str]:
    """Registered method names supporting ``setting`` and ``kind`` (either may be omitted)."""
    _check_choice("setting", setting, SETTINGS)
    _check_choice("kind", kind, REQUEST_KINDS)
    return sorted(name for name, classes in _METHODS.items() if any(c.supports(setting, kind) for c in classes))


def _check_choice(what: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
