"""Acts on this machine: the rescue of training runs (their discovery, launch, dumps), the host
UPS (NUT, apcupsd), the uplink (probes, failover, the dongle, bonds, hotplug, the data cap), the
outage diagnosis, the doctor and the systemd unit. Never imports bridge/."""
