"""Test "hosts" on one machine: network namespaces joined by veth links (two hosts: one veth
pair; more: each host's veth plugged into a bridge in a switch namespace of its own), each with
an address of a private 10.x subnet that exists only inside them and a default route, plus the
commands that run a program "on" a host: inside its network namespace and, with
``unshare --uts``, under its own hostname. Needs root and iproute2 (``ip netns``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: why the namespace tests cannot run here, or None
MISSING = ("needs root and iproute2 (ip netns)"
           if os.geteuid() != 0 or shutil.which("ip") is None else None)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Hosts:
    """Namespaces (also the hosts' hostnames) and their addresses, in order."""

    names: list[str]
    addrs: list[str]

    def command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run on host ``i``: in its network namespace, under its hostname."""
        return ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[i], *argv]


@contextmanager
def make_hosts(count: int, subnet: str) -> Iterator[Hosts]:
    """``count`` hosts with addresses ``subnet.1`` .. ``subnet.count`` (``subnet``: three
    octets of a 10.x network); everything is deleted on exit. Raises OSError or
    CalledProcessError when namespaces cannot be made here."""
    tag = uuid.uuid4().hex[:6]
    names = [f"vk{chr(65 + i)}{tag}" for i in range(count)]
    switch = f"vkS{tag}" if count > 2 else None
    made: list[str] = []
    try:
        for ns in names + ([switch] if switch else []):
            ip("netns", "add", ns)
            made.append(ns)
        if switch:
            ip("-n", switch, "link", "add", "br0", "type", "bridge")
            ip("-n", switch, "link", "set", "br0", "up")
        for i, ns in enumerate(names):
            dev, other = f"v{i}{tag}", f"w{i}{tag}"
            if switch is None and i == 1:
                continue  # two hosts: the first pair links them directly
            peer_ns = switch or names[1]
            ip("link", "add", dev, "type", "veth", "peer", "name", other)
            ip("link", "set", dev, "netns", ns)
            ip("link", "set", other, "netns", peer_ns)
            if switch:
                ip("-n", switch, "link", "set", other, "master", "br0")
            ip("-n", peer_ns, "link", "set", other, "up")
            ends = [(ns, dev, i)] if switch else [(ns, dev, 0), (names[1], other, 1)]
            for host_ns, link, index in ends:
                ip("-n", host_ns, "addr", "add", f"{subnet}.{index + 1}/24", "dev", link)
                ip("-n", host_ns, "link", "set", link, "up")
                ip("-n", host_ns, "link", "set", "lo", "up")
                # a default route, as real hosts have (the mpi bootstrap's address guess)
                ip("-n", host_ns, "route", "add", "default", "dev", link)
        yield Hosts(names, [f"{subnet}.{i + 1}" for i in range(count)])
    finally:
        for ns in made:  # deleting a namespace also removes its ends of the veth pairs
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
