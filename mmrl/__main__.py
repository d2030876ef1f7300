"""``python -m mmrl ...`` (also what ``torchrun -m mmrl`` and ``accelerate launch -m mmrl`` run)."""

import sys

from mmrl.cli import main

sys.exit(main())
