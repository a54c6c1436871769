"""``python -m commlib.launch``: the same as ``commlibrun``."""
import sys

from .launcher import main

sys.exit(main())
