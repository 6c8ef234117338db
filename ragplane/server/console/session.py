"""Who is calling the console: the API key kept in a cookie, judged by the server's own
`KeyStore.check` (the same keys, hashes, tenants and errors as gRPC and the OpenAI API).

The console's rule on scopes: every page needs `read` (a read-only key sees everything),
every action that changes something needs `admin`, checked here on the server for each
POST whatever the page showed. The cookie is HttpOnly (no script reads the key) and
SameSite=Strict (no other site's page sends it); forms carry a CSRF token besides, an
HMAC of the key under a secret of this process, so a form is only good for the key and
the server that rendered it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from ragplane.core.errors import PermissionDenied
from ragplane.server.auth import KeyStore, Principal

COOKIE = "ragplane_console"
#: The RPC whose scope (read) every console page needs: what a read-only key may call.
VIEW_RPC = "/ragplane.v1.IndexService/ListCollections"


class Sessions:
    def __init__(self, keys: KeyStore, *, secure: bool) -> None:
        self.keys = keys
        self.secure = secure  # served over TLS: the cookie never leaves it
        self._secret = secrets.token_bytes(32)

    @property
    def enabled(self) -> bool:
        """False with no keys at all (a loopback-only server): everyone is the admin."""
        return self.keys.enabled

    @staticmethod
    def key_of(request: Request) -> str:
        return request.cookies.get(COOKIE, "")

    def principal(self, request: Request) -> Principal:
        """The caller, with the read scope, or Unauthenticated / PermissionDenied; sets
        `auth.current` (the tenant the domain services act for)."""
        key = self.key_of(request)
        return self.keys.check(VIEW_RPC, f"Bearer {key}" if key else "", sent_as="cookie")

    def sign_in(self, key: str) -> Principal:
        """Check a key typed into the sign-in form (Unauthenticated when unknown)."""
        return self.keys.check(VIEW_RPC, f"Bearer {key.strip()}" if key.strip() else "")

    @staticmethod
    def require_admin(principal: Principal, action: str) -> None:
        if "admin" not in principal.scopes:
            raise PermissionDenied(
                f"{action} needs the 'admin' scope; this key has "
                f"{', '.join(sorted(principal.scopes))}"
            )

    def csrf(self, request: Request) -> str:
        key = self.key_of(request).encode()
        return hmac.new(self._secret, b"csrf:" + key, hashlib.sha256).hexdigest()[:32]

    def check_csrf(self, request: Request, token: str) -> None:
        if not hmac.compare_digest(self.csrf(request), token or ""):
            raise PermissionDenied(
                "the form's CSRF token does not match this session; reload the page and retry"
            )

    def set_cookie(self, response: Response, key: str) -> None:
        response.set_cookie(
            COOKIE, key.strip(), httponly=True, samesite="strict", secure=self.secure,
            path="/console",
        )

    @staticmethod
    def clear_cookie(response: Response) -> None:
        response.delete_cookie(COOKIE, path="/console")
