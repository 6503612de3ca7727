"""Listening sockets of a process tree, read from /proc (Linux): what `ss -ltnup` shows."""
from __future__ import annotations

import ipaddress
import os
import socket
import struct

TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(d))
    return out


def descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children, seen, stack = _children(), set(), [root]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, []))
    return seen


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _decode(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:  # four little-endian 32-bit words
        words = struct.unpack("<4I", raw)
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
    return ip, int(port, 16)


def _bound_inodes() -> dict[int, tuple[str, str, int]]:
    """inode -> (protocol, local ip, port) of every listening TCP and bound UDP socket."""
    out = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{proto}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            state = cols[3]
            if (proto.startswith("tcp") and state != TCP_LISTEN) or (
                    proto.startswith("udp") and state != UDP_UNCONNECTED):
                continue
            ip, port = _decode(cols[1])
            out[int(cols[9])] = (proto, ip, port)
    return out


def listening_sockets(pids) -> list[tuple[int, str, str, int]]:
    """(pid, protocol, local ip, port) for every listening socket the given processes hold."""
    inodes = _bound_inodes()
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found.append((pid, *inodes[inode]))
    return found


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback
