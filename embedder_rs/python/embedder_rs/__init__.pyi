from ._native import Embedder as Embedder
from ._native import EmbedderError as EmbedderError
from ._native import __version__ as __version__

__all__ = ["Embedder", "EmbedderError", "__version__"]
