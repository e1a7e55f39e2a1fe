"""Shared fixtures. Helpers for building small profiles live in tests/profiles_util.py."""

from __future__ import annotations

import os
import tempfile

# Tests must be deterministic and light on this 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The CLI caches vetting verdicts under $XDG_CACHE_HOME/popviz: never the user's own cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="popviz-test-cache-")

# the imported H100 recordings (`resnet`, `pipeline`) for the import tests; the bundled
# measured and modelled example profiles (`measured`, `modelled`)
pytest_plugins = ["tests.import_fixtures", "tests.bundled_fixtures"]
