"""The report sockets, bound before anything slow is loaded.

`serve` binds one UDP socket per receiving process as soon as its settings are read, before
it imports the rest (InfluxDB client, HTTP, the workers' start-up), so a switch's reports
wait in a socket's receive buffer from that moment on instead of finding no socket (and
being refused) while the service loads. The supervisor holds the sockets for its whole
life and hands worker k socket k, also when it restarts that worker: the set of sockets in
the SO_REUSEPORT group, and so which switch reaches which worker, never changes while the
service runs, and what arrived while a worker was down is read by its successor.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct

from .settings import Settings, StartError

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_ATTACH_REUSEPORT_CBPF = 51  # linux/asm-generic/socket.h

# Classic BPF opcodes (linux/filter.h)
_LD_B_ABS, _LD_W_ABS = 0x30, 0x20
_RSH_K, _MUL_K, _MOD_K = 0x74, 0x24, 0x94
_JEQ_K = 0x15
_RET_A, _RET_K = 0x16, 0x06


def balancer(workers: int) -> bytes:
    """A classic BPF program for SO_ATTACH_REUSEPORT_CBPF that picks a Telemetry Report
    v2.0 datagram's worker from the reporting switch's Node ID (bytes 4..7 of the UDP
    payload, where the program starts), through Knuth's multiplicative hash so that node
    IDs in any pattern spread evenly: every switch stays on one worker (its sequence
    numbers and links in one place) and 48 switches split 24/24 instead of as the kernel's
    hash of source ports falls. Anything else (v1.0, too short) returns an index past the
    group, and the kernel falls back to that hash."""
    prog = [
        (_LD_B_ABS, 0, 0, 0),  # A = payload[0]
        (_RSH_K, 0, 0, 4),  # A = report version
        (_JEQ_K, 0, 5, 2),  # v2.0 goes on; else to "return past the group"
        (_LD_W_ABS, 0, 0, 4),  # A = node id (a packet too short ends the program: 0)
        (_MUL_K, 0, 0, 2654435761),  # Knuth: (A * 2^32/phi) >> 16, then modulo workers
        (_RSH_K, 0, 0, 16),
        (_MOD_K, 0, 0, workers),
        (_RET_A, 0, 0, 0),
        (_RET_K, 0, 0, 0xFFFFFFFF),
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def attach_balancer(sock: socket.socket, workers: int) -> bool:
    """Attach `balancer` to the socket's SO_REUSEPORT group (one socket of the group is
    enough); False where the kernel does not take it (then its own hash spreads)."""
    code = balancer(workers)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError:
        return False
    return True


def set_receive_buffer(sock: socket.socket, size: int) -> int:
    """Ask for `size` bytes of receive buffer: past net.core.rmem_max where the process
    may (SO_RCVBUFFORCE needs CAP_NET_ADMIN), else up to that cap. Returns what the
    kernel granted (it doubles the request for its bookkeeping)."""
    for opt in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
            break
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def bind_udp(settings: Settings, count: int) -> list[socket.socket]:
    """`count` UDP sockets on the listen address, one SO_REUSEPORT group; StartError (one
    line) when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in settings.listen_host else socket.AF_INET
    socks: list[socket.socket] = []
    port = settings.listen_port
    try:
        for _ in range(count):
            s = socket.socket(family, socket.SOCK_DGRAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            set_receive_buffer(s, settings.receive_buffer_bytes)
            s.bind((settings.listen_host, port))
            port = s.getsockname()[1]  # port 0: the others join the one the first got
        if count > 1:
            attach_balancer(socks[0], count)
    except OSError as e:
        for s in socks:
            s.close()
        where = f"{settings.listen_host}:{settings.listen_port}"
        raise StartError(f"listen: cannot bind udp {where} ({e.strerror or e})") from None
    return socks
