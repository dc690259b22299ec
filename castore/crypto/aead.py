"""AES-256-GCM-SIV sealing of frames (:class:`AeadCipher`), for :class:`castore.objects.Codec`.

A sealed value is ``nonce:12 ciphertext tag:16``: a fresh random nonce (``os.urandom``) per
sealing, in front of what ``cryptography``'s AESGCMSIV makes. GCM-SIV resists nonce misuse:
should two sealings ever draw the same nonce (at 2^32 sealings under one key the chance is
2^-33), the most that leaks is whether their two plaintexts were equal. The associated data
(the object's id and tenant, or a record's tenant) is authenticated, not stored: bytes moved
to another id or tenant do not open.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from ..errors import CastoreError, SealedFrameError

NONCE = 12
TAG = 16
KEY = 32
#: the bytes sealing adds to a plaintext
OVERHEAD = NONCE + TAG


def _aead() -> tuple[Any, type[Exception]]:
    """cryptography's AESGCMSIV class and InvalidTag, imported on first use.

    Raises:
        CastoreError: cryptography is not installed, or its OpenSSL lacks AES-GCM-SIV.
    """
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV
    except ImportError as e:
        raise CastoreError("encrypted stores need the cryptography package: pip install 'castore[crypto]'") from e
    return AESGCMSIV, InvalidTag


class AeadCipher:
    """Seals and opens bytes with AES-256-GCM-SIV under one 32-byte key (a tenant's ``enc_key``).

    Raises:
        CastoreError: (constructor) a key that is not 32 bytes; cryptography missing
            (``pip install 'castore[crypto]'``) or built without AES-GCM-SIV.
    """

    __slots__ = ("_key", "_aead", "_invalid")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != KEY:
            raise CastoreError(f"an encryption key is {KEY} bytes")
        cls, self._invalid = _aead()
        from cryptography.exceptions import UnsupportedAlgorithm
        try:
            self._aead = cls(key)
        except UnsupportedAlgorithm as e:
            raise CastoreError(f"this cryptography/OpenSSL build cannot do AES-GCM-SIV ({e})") from e
        self._key = key

    def __repr__(self) -> str:
        return "AeadCipher(AES-256-GCM-SIV)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AeadCipher) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return id(self)

    def seal(self, plaintext: bytes, ad: bytes) -> bytes:
        """``plaintext`` encrypted and bound to ``ad``: a fresh random nonce, the ciphertext and
        the tag (:data:`OVERHEAD` bytes more than ``plaintext``). Raises nothing."""
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, plaintext, ad)

    def open(self, sealed: bytes, ad: bytes) -> bytes:
        """The plaintext of :meth:`seal`'s output, checked against ``ad``.

        Raises:
            SealedFrameError: too short, or it does not authenticate: another key, other
                associated data (moved to another id or tenant), or damaged bytes.
        """
        if len(sealed) < OVERHEAD:
            raise SealedFrameError("sealed frame", f"{len(sealed)} bytes is shorter than a nonce and a tag")
        try:
            return self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], ad)
        except self._invalid as e:
            raise SealedFrameError(
                "sealed frame",
                "does not open with this store's key (a wrong key, bytes moved from another object "
                "or tenant, or damage)") from e
