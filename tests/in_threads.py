"""Threads for the tests: jobs started together, failures collected as tracebacks."""
import threading
import traceback


def in_threads(job, count: int, main_work=None) -> list:
    """``job(i)`` for i < ``count``, each in its own thread, all released at once (then ``main_work(threads)`` runs
    in this thread, where given, while they do); returns the tracebacks of failures."""
    failures, barrier = [], threading.Barrier(count + 1)

    def run(i):
        try:
            barrier.wait()
            job(i)
        except Exception:
            failures.append(traceback.format_exc())
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    try:
        if main_work is not None:
            main_work(threads)
    except Exception:
        failures.append("main thread: " + traceback.format_exc())
    for t in threads:
        t.join()
    return failures
