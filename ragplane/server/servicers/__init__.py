"""Thin gRPC servicers: decode the request, call domain code, encode the reply."""
