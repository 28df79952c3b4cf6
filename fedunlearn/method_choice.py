"""The unlearning methods by name and setting, without importing them (they import torch): what the
command line checks ``process --method`` and ``benchmark --methods`` against before a server or a
flow starts (issue 37, "input checked first"). tests/test_cli_startup.py holds this table to the
registry (``fedunlearn.unlearning.available_methods``), so a method registered there and not here
fails the suite, not a user."""

from __future__ import annotations

from fedunlearn.errors import InputError

AUTO = "auto"  # process-deletions' default: the setting's and request kind's own method
METHOD_SETTINGS: dict[str, tuple[str, ...]] = {
    "certified-dfu": ("dfl",),
    "certified-dfu-paper": ("dfl",),
    "fedora": ("vfl",),
    "fedquit": ("hfl",),
    "finetune": ("hfl",),
    "ga": ("hfl", "vfl"),
    "hf-kcu": ("hfl",),
    "puf-regular": ("hfl",),
    "puf-special": ("hfl",),
    "retrain": ("dfl", "hfl", "vfl"),
}


def methods_for(setting: str) -> list[str]:
    return [name for name, settings in METHOD_SETTINGS.items() if setting in settings]


def require_method(name: str, setting: str, scenario: str) -> None:
    """``name`` is ``auto`` or a method that unlearns in ``setting``, else one line naming those that do."""
    if name == AUTO:
        return
    usable = ", ".join([AUTO, *methods_for(setting)])
    if name not in METHOD_SETTINGS:
        raise InputError(f"unknown method {name!r}; for {scenario} ({setting}) choose one of {usable}")
    if setting not in METHOD_SETTINGS[name]:
        raise InputError(f"method {name!r} does not unlearn in {setting} ({scenario} is {setting}); choose one of "
                         f"{usable}")


def require_methods(listing: str, setting: str, scenario: str) -> None:
    """A comma-separated list (``benchmark --methods``) of methods for ``setting``, or ``all``."""
    if listing.strip() == "all":
        return
    names = [m.strip() for m in listing.split(",") if m.strip()]
    wrong = [m for m in names if setting not in METHOD_SETTINGS.get(m, ())]
    if not names or wrong:
        raise InputError(f"--methods {listing!r}: {', '.join(repr(m) for m in wrong) or 'no method named'}"
                         f" {'is' if len(wrong) == 1 else 'are'} not a method for {scenario} ({setting}); "
                         f"choose 'all' or from {', '.join(methods_for(setting))}")
