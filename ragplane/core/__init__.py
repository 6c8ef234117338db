"""The bottom layer: what both index/ and server/ stand on (errors, SQLite connections).

It imports nothing of ours, so every other package may import it.
"""
