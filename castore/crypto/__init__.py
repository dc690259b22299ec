"""Encryption at rest (docs/FORMAT.md): the only place castore touches a cipher.

``aead``: :class:`~castore.crypto.aead.AeadCipher`, the authenticated cipher an encrypted
store's :class:`~castore.objects.Codec` seals frames with. The ``cryptography`` package (the
``castore[crypto]`` extra) is imported here only, and only when a cipher is made: an
unencrypted store never imports it.
"""
