"""Encryption at rest (docs/FORMAT.md, docs/encryption.md): the only place castore touches a cipher.

``aead``: :class:`~castore.crypto.aead.AeadCipher`, the authenticated cipher an encrypted
store's :class:`~castore.objects.Codec` seals frames with. ``keys``: master keys, the wrapping
of keys (and the KMS hook, :class:`~castore.crypto.keys.CallableWrapper`), the derivation of a
tenant's id and encryption keys. ``keystore``: :class:`~castore.crypto.keystore.KeyStore`, the
wrapped app and data keys, the key check, erasure records, rotation. ``args``: where
``Store.open``'s encryption arguments may be given (never as storage options). The ``cryptography``
package (the ``castore[crypto]`` extra) is imported here only, and only when a cipher or key
is made: an unencrypted store never imports it.
"""
