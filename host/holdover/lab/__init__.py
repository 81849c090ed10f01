"""The whole chain on one machine (broker, sentinel emulator, bridge) for the demo, tests and benchmarks."""
