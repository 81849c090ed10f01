"""`make test` runs inside a private network namespace: only loopback, no route anywhere else."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("HOLDOVER_SEALED") != "1", reason="not run through scripts/sealed (make test does)"
)


def test_only_loopback_exists() -> None:
    # /proc/net/dev is per namespace (/sys/class/net still shows the host's sysfs after unshare).
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    assert sorted(line.split(":")[0].strip() for line in lines) == ["lo"]


def test_nothing_off_this_machine_is_reachable() -> None:
    # TEST-NET-1 (RFC 5737) is never a real host; the point is the error: no route at all.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        with pytest.raises(OSError) as e:
            s.connect(("192.0.2.1", 53))
            s.send(b"x")
        assert e.value.errno == errno.ENETUNREACH


def test_namespaces_made_inside_still_work(tmp_path: Path) -> None:
    """Two namespaces of the test's own, a veth pair between them, a TCP round trip across it."""
    import subprocess
    import sys

    a, b = f"hotest-a-{os.getpid()}", f"hotest-b-{os.getpid()}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", a)
    ip("netns", "add", b)
    try:
        ip("link", "add", "hoveth-a", "netns", a, "type", "veth", "peer", "name", "hoveth-b", "netns", b)
        ip("-n", a, "addr", "add", "10.231.0.1/30", "dev", "hoveth-a")
        ip("-n", b, "addr", "add", "10.231.0.2/30", "dev", "hoveth-b")
        for ns, dev in ((a, "hoveth-a"), (b, "hoveth-b")):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", b, sys.executable, "-c",
             "import socket; s=socket.create_server(('10.231.0.2', 7001)); print('up', flush=True);"
             "c,_=s.accept(); c.sendall(c.recv(16).upper())"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        out = subprocess.run(
            ["ip", "netns", "exec", a, sys.executable, "-c",
             "import socket; c=socket.create_connection(('10.231.0.2', 7001), 5); c.sendall(b'ping');"
             "print(c.recv(16).decode())"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        server.wait(10)
        assert out.stdout.strip() == "PING", out.stderr
    finally:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)
