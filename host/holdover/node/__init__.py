"""Acts on this machine: rescue of training runs, their discovery, dumps, launch. Never imports bridge/."""
