"""``python -m cuda_p2p``: what cuda_p2p is doing here (python/cuda_p2p/_diagnose.py)."""

import sys

from ._diagnose import main

sys.exit(main())
