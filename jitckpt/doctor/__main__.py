"""``python -m jitckpt.doctor ARGS``: the same as `jit-run doctor ARGS`."""

import sys

from jitckpt.doctor.cli import main

sys.exit(main())
