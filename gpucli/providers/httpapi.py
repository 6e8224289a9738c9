"""Shared plumbing of the providers that speak an HTTP API (RunPod, vast.ai)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpucli.providers.api import Provider
from gpucli.providers.credentials import resolve_key
from gpucli.providers.http import HttpClient, RetryPolicy


class ApiProvider(Provider):
    """A provider behind an HTTP API: the client is built on first use, so constructing a provider
    never needs a key; the SSH user is root unless a custom image (or a test emulator) says otherwise."""

    service: str = ""  # the key name (gpucli keys set NAME) and the HTTP helper's service label

    def __init__(self, *, api_key: str | None = None, base_url: str | None = None,
                 policy: RetryPolicy | None = None, sleep: Callable[[float], None] | None = None,
                 ssh_user: str | None = None, read_timeout_s: float = 60.0) -> None:
        self._api_key = api_key
        self._base_url = base_url
        self._policy = policy
        self._sleep = sleep
        self._ssh_user = ssh_user
        self._read_timeout_s = read_timeout_s
        self._client: HttpClient | None = None

    def default_base_url(self) -> str:
        raise NotImplementedError

    @property
    def http(self) -> HttpClient:
        if self._client is None:
            key = self._api_key or resolve_key(self.name).value
            kwargs: dict[str, Any] = {"policy": self._policy, "read_timeout_s": self._read_timeout_s}
            if self._sleep is not None:
                kwargs["sleep"] = self._sleep
            self._client = HttpClient(self._base_url or self.default_base_url(), api_key=key,
                                      service=self.service, **kwargs)
        return self._client

    @property
    def ssh_user(self) -> str:
        return self._ssh_user or os.environ.get("GPUCLI_POD_SSH_USER") or "root"
