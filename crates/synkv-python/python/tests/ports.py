"""Free ports for the processes a test starts, outside the kernel's ephemeral range.

A port found by binding ``:0`` and releasing it comes from the ephemeral range, which every
outgoing connection on the host also draws from: before the started process binds it, a
connection can take it, and the process fails with "Address already in use" (CI saw it when a
torchrun-style job's scheduler bound ``MASTER_PORT + 1``). A port below that range is only taken
by an explicit bind. The same rule as ``synkv::ps::transport::ports`` on the Rust side.

    from ports import free_port
    port = free_port(2)  # port and port + 1 are both free
"""

import random
import socket

_handed_out = set()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(w) for w in f.read().split()[:2])
            return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


def free_port(count=1):
    """The first of ``count`` consecutive ports of 127.0.0.1 that all bind now."""
    lo, hi = _ephemeral_range()
    last_first = 65535 - (count - 1)
    if lo > 11000 and lo - 10000 > count:
        start, end = 10000, lo - count
    elif hi < last_first:
        start, end = hi + 1, last_first
    else:  # the ephemeral range covers nearly every port: any from 1024
        start, end = 1024, last_first
    for _ in range(256):
        first = random.randint(start, end)
        ports = range(first, first + count)
        if any(p in _handed_out for p in ports):
            continue
        socks = []
        try:
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        _handed_out.update(ports)
        return first
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")
