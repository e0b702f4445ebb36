"""The CUDA smoke suite runs from ``make test-gpu`` only (``SCALEGNN_TEST_GPU=1``).

``make test`` must never report a skip, and on a machine without a GPU every test here
would be one; so the plain suite does not collect this directory at all.
"""

import os

if os.environ.get("SCALEGNN_TEST_GPU") != "1":
    collect_ignore_glob = ["test_*.py"]
