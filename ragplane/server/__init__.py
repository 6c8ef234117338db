"""ragplane's service: gRPC servicers over the embedding, index, memory and shadow domains."""

__version__ = "0.1.0"
