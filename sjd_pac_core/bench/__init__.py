"""sjd-pac bench: speed and exactness evidence (see docs/benchmark.md)."""
