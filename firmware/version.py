# The firmware's release, as Home Assistant shows it (sw_version) and the host's package carries it
# (tests/bridge/test_ha.py holds the two equal: the host deploys the firmware it ships with).
VERSION = "0.1.0"
