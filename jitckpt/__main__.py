"""``python -m jitckpt ...`` is ``jit-run ...``."""

import sys

from jitckpt.launch.cli import main

sys.exit(main())
