"""Bulk work on many passages at once: `ragplane ingest` and the re-embedding of rebuilds.

One pipeline, two places to run it: in this process, or on a Ray cluster (Ray Data) when
one is named. Rows are read with their file and line (`rows`), embedded by the canonical
embedder loaded once per worker (`embed`), and written through the gRPC API by the driver
(`pipeline`); `raydata` is the only module that imports Ray. A folder of documents is
read by `files` and written as text by `folder`: the server chunks and embeds it.
"""
