"""Talks to the sentinel: links in, the gate's verdicts, the service loop, hooks."""

from holdover.bridge.service import Bridge, BridgeThread, SentinelView

__all__ = ["Bridge", "BridgeThread", "SentinelView"]
