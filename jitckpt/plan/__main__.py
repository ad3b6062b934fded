"""``python -m jitckpt.plan ARGS``: the same as `jit-run plan ARGS`."""

import sys

from jitckpt.plan.cli import main

sys.exit(main())
