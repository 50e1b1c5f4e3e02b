"""`python -m tpu_tuner.cli`: the `tpu-tune` command."""

import sys

from tpu_tuner.cli import main

sys.exit(main())
