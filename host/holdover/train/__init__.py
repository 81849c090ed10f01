"""Training-side hooks: protect a run, checkpoint it atomically, resume from the newest verified save.

The core (this package without `state`) needs no torch; `state` and the callbacks import it.
"""

from holdover.train.ckpt import CheckpointError
from holdover.train.guard import Guard, protect
from holdover.train.schedule import AdaptiveInterval

__all__ = ["AdaptiveInterval", "CheckpointError", "Guard", "protect"]
