"""Serves people: the HTTP API, the dashboard page, and the snapshots `holdover status` prints."""
