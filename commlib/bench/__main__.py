"""``python -m commlib.bench``: the benchmark CLI (commlib.bench.bench)."""
import sys

from .bench import main

sys.exit(main())
