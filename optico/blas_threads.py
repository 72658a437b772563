"""One BLAS thread per OptiCo process.

The job model's linear algebra is small (a pool of thousands of configurations by tens of trials):
OpenBLAS's threads spin on it more than they compute, and worse when other processes share the
cores. `optico tune examples/llama3-8b-a100.yaml` on 2 cores with other work running, three runs
each, alternated: 6.8-7.7 s with OpenBLAS's default threads, 4.9-5.0 s with one. Trial processes
are separate processes and keep their own settings.
"""

from __future__ import annotations


def limit_blas_threads() -> None:
    """Caps every BLAS library loaded so far (numpy's and scipy's, loaded here first) to one thread,
    for the whole process: `optico serve` runs several jobs in threads of one process, so a scoped
    limit would be undone by whichever job ends first."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401  (scipy ships its own OpenBLAS)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
