"""holdover: a power and uplink sentinel that saves long training runs."""

__version__ = "0.1.0"
