"""memento: in-memory checkpointing for large-model training, from Python.

    import memento
    client = memento.Client.connect("job", rank=0, world_size=1)

The C++ client (include/memento/client.h) is the extension ``memento._memento``;
``memento.torch`` builds a state_dict checkpointer for PyTorch on it,
``memento.swift`` has SWIFT's update-undo and pipeline message log, and
``memento.load_durable`` reads a version that the durable tier wrote
(``memento export``). See docs/python.md.

Every failed call raises ``memento.Error`` with ``.code`` (the Status code
name: "NotFound", "DataLoss", "InvalidArgument", ...) and ``.message``.
"""

from memento._memento import Client, Error, HAVE_CUDA, __version__  # noqa: F401
from memento.durable import load_durable  # noqa: F401

__all__ = ["Client", "Error", "HAVE_CUDA", "__version__", "load_durable"]
