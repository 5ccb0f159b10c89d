"""Several real processes released at the same instant, for the tests of what races do.

``race(target, [args, ...])`` spawns one process per argument tuple running
``target(*args, barrier, out)``: the target does its slow setup (imports, connections), waits on
``barrier``, then does the racing work and puts one result on ``out`` (a dict; ``{"error": ...}``
if it failed). Returns the results in completion order and fails if any process failed.
"""
import multiprocessing


def race(target, arg_tuples, *, timeout: float = 300.0) -> list:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(len(arg_tuples)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, out)) for args in arg_tuples]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all("error" not in r for r in results), results
    return results
