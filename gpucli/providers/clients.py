"""Provider registry: a name -> ``"module:Class"`` table, imported only when a provider is asked for.

Adding a provider is one file plus one line here. Imports are lazy so that listing names (for
``--provider`` help and validation) costs nothing and ``gpucli --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpucli.errors import UnknownNameError

if TYPE_CHECKING:
    from gpucli.providers.api import Provider

REGISTRY: dict[str, str] = {
    "runpod": "gpucli.providers.runpod.api:RunPodProvider",
    "vast": "gpucli.providers.vast.api:VastProvider",
}

ALIASES: dict[str, str] = {"vastai": "vast", "vast.ai": "vast"}


def provider_names() -> list[str]:
    return sorted(REGISTRY)


def get_provider(name: str, **kwargs: Any) -> Provider:
    """A ready client for ``name``. Keyword arguments go to the class (e.g. an HTTP retry policy)."""
    key = ALIASES.get(name.lower(), name.lower())
    target = REGISTRY.get(key)
    if target is None:
        raise UnknownNameError("provider", name, REGISTRY)
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**kwargs)
