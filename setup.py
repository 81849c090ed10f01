"""The package list, found by rule: pyproject.toml cannot say "every package under host/, plus the
firmware from its own directory" (find and an explicit list exclude each other), and a hand-kept
list once shipped a wheel without holdover.cluster."""

from setuptools import find_packages, setup

setup(packages=[*(p for p in find_packages("host") if p.startswith("holdover")), "holdover.firmware"])
