"""Every BLAS library an OptiCo process has loaded runs one thread (optico/blas_threads.py)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_command_line_leaves_every_blas_library_at_one_thread() -> None:
    """Run in a fresh interpreter, as `optico` is: numpy's and scipy's OpenBLAS both, whatever the
    machine's core count would have given them."""
    probe = ("import json, sys\n"
             "from threadpoolctl import threadpool_info\n"
             "from optico.cli import run_cli\n"
             "run_cli(['perfmodel', '--help'])\n"
             "print(json.dumps([(i['filepath'], i['num_threads']) for i in threadpool_info()"
             " if i['user_api'] == 'blas']), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "4"})
    assert done.returncode == 0, done.stderr[-2000:]
    libraries = json.loads(done.stderr.strip().splitlines()[-1])
    assert len(libraries) >= 2, libraries  # numpy's and scipy's
    assert all(threads == 1 for _, threads in libraries), libraries
