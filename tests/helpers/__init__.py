"""What several test modules share, each once: :mod:`.threads` (run calls on threads at once
and collect what they raise), :mod:`.storage` (a pass-through
:class:`~castore.storage.Storage` wrapper to override one call of), :mod:`.viewer` (the HTML
viewer's state replay), :mod:`.held` (a group commit held open while calls queue behind it),
:mod:`.sessionmodel` (the plain reference model of the stateful test, ``test_model.py``),
:mod:`.interrupt` (an operation stopped right after each of its ref moves).
The store fixtures live in ``tests/conftest.py``."""
