"""Connection settings: explicit arguments, then environment variables, then in-cluster defaults."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_GATEWAY_URL = "http://orchard-operator-gateway.orchard-system.svc:8080"

ENV_GATEWAY_URL = "ORCHARD_GATEWAY_URL"
ENV_TOKEN = "ORCHARD_TOKEN"
ENV_TOKEN_FILE = "ORCHARD_TOKEN_FILE"
ENV_NAMESPACE = "ORCHARD_NAMESPACE"


class TokenSource:
    """A bearer token, fixed or read from a file that may be rotated (projected service-account
    tokens are refreshed by the kubelet): the file is re-read when it changed, at most every 10 s."""

    def __init__(self, token: str | None = None, path: str | os.PathLike[str] | None = None) -> None:
        self._token = token.strip() if token else None
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self._checked = 0.0
        self._mtime: float | None = None

    def get(self) -> str | None:
        """The current token, or None when there is none."""
        if self._path is None:
            return self._token
        now = time.monotonic()
        with self._lock:
            if self._token is None or now - self._checked >= 10.0:
                self._checked = now
                try:
                    mtime = self._path.stat().st_mtime
                    if mtime != self._mtime or self._token is None:
                        self._token = self._path.read_text().strip() or None
                        self._mtime = mtime
                except OSError:
                    pass
            return self._token

    def cached(self) -> str | None:
        """The token as last read, without waiting for the lock (for exit and signal handlers, which
        may interrupt a thread holding it); read from the file when it never was."""
        if self._token is not None or self._path is None:
            return self._token
        try:
            return self._path.read_text().strip() or None
        except OSError:
            return None


@dataclass(frozen=True)
class Settings:
    """Resolved connection settings."""

    base_url: str
    namespace: str
    token: TokenSource


def resolve(
    base_url: str | None,
    token: str | None,
    token_file: str | os.PathLike[str] | None,
    namespace: str | None,
) -> Settings:
    """Explicit values win; then ``ORCHARD_GATEWAY_URL``, ``ORCHARD_TOKEN``/``ORCHARD_TOKEN_FILE``,
    ``ORCHARD_NAMESPACE``; then the pod's service account (token and namespace) and the in-cluster
    gateway Service."""
    url = base_url or os.environ.get(ENV_GATEWAY_URL) or DEFAULT_GATEWAY_URL
    if token is not None:
        source = TokenSource(token=token)
    elif token_file is not None:
        source = TokenSource(path=token_file)
    elif os.environ.get(ENV_TOKEN):
        source = TokenSource(token=os.environ[ENV_TOKEN])
    elif os.environ.get(ENV_TOKEN_FILE):
        source = TokenSource(path=os.environ[ENV_TOKEN_FILE])
    elif (SERVICE_ACCOUNT_DIR / "token").exists():
        source = TokenSource(path=SERVICE_ACCOUNT_DIR / "token")
    else:
        source = TokenSource()
    ns = namespace or os.environ.get(ENV_NAMESPACE)
    if not ns:
        try:
            ns = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
        except OSError:
            ns = ""
    return Settings(base_url=url.rstrip("/"), namespace=ns or "default", token=source)
