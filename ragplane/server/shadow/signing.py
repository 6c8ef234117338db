"""Provenance of release entries: each entry of self-hosted-releases.json is signed (Ed25519)
by the server that measured it, and G3 counts only entries whose signature verifies under
a key koder.toml trusts.

A hand-written entry, one edited after it was recorded, or one from a server nobody listed
is refused by name, with the reason. What is signed is the entry as written, less its
`signature` object, in canonical JSON (sorted keys, no spaces, ASCII), so the signature
survives re-indenting the file but not a changed number.

The key: `release-signing.key` in the server's data directory (PKCS#8 PEM, mode 0600),
made on first use. Its id is the first 16 hex digits of the SHA-256 of the raw public key;
`ragplane shadow record-release` prints it, and koder.toml lists the keys it trusts:

    [release_keys]
    "1f2e3d4c5b6a7988" = "<the raw public key, base64>"
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

KEY_FILE = "release-signing.key"
ALGORITHM = "ed25519"


def canonical_bytes(entry: Mapping[str, Any]) -> bytes:
    """What a signature covers: the entry without its signature, as canonical JSON."""
    body = {k: v for k, v in entry.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_text(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Signer:
    """This server's signing key."""

    private: Ed25519PrivateKey

    @classmethod
    def in_dir(cls, data_dir: str | os.PathLike[str]) -> Signer:
        """The key of `data_dir`, made (readable by its owner only) when there is none."""
        path = Path(data_dir) / KEY_FILE
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} is not an Ed25519 private key")
            return cls(key)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return cls(key)

    @property
    def key_id(self) -> str:
        return key_id(self.private.public_key())

    @property
    def public(self) -> str:
        """The raw public key, base64: what koder.toml's [release_keys] lists."""
        return public_text(self.private.public_key())

    def sign(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """`entry` with its `signature` object."""
        value = self.private.sign(canonical_bytes(entry))
        signature = {
            "algorithm": ALGORITHM,
            "key_id": self.key_id,
            "value": base64.b64encode(value).decode(),
        }
        return {**{k: v for k, v in entry.items() if k != "signature"}, "signature": signature}


def verify(entry: Mapping[str, Any], trusted: Mapping[str, str]) -> str:
    """Why `entry` does not verify under the `trusted` keys (key id -> base64 raw public
    key), or "" when it does."""
    sig = entry.get("signature")
    if not isinstance(sig, dict):
        return "unsigned (no server signed what it measured)"
    kid = str(sig.get("key_id", ""))
    if sig.get("algorithm") != ALGORITHM:
        return f"signature algorithm {sig.get('algorithm')!r}, not {ALGORITHM}"
    if kid not in trusted:
        return f"signed by key {kid or '(none)'}, which koder.toml's [release_keys] does not trust"
    try:
        raw = base64.b64decode(trusted[kid], validate=True)
        public = Ed25519PublicKey.from_public_bytes(raw)
        value = base64.b64decode(str(sig.get("value", "")), validate=True)
    except (binascii.Error, ValueError):
        return f"key {kid} or the signature is not valid base64 Ed25519"
    if key_id(public) != kid:
        return f"koder.toml lists a public key under {kid} whose id is {key_id(public)}"
    try:
        public.verify(value, canonical_bytes(entry))
    except InvalidSignature:
        return f"the signature of key {kid} does not verify: the entry changed after it was signed"
    return ""
