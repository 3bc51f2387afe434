"""A script job that attacks the network from inside its rank, as a plain
user's one-file script could: it scans every TCP port of the loopback
addresses and of the host's own addresses, speaks Postgres's protocol to
the platform's database (by its port and by its socket path), calls the
API and the object store, the metadata address, another job's TCPStore
(by the host's addresses and by the job's block of rank addresses), and
sends UDP and raw packets. What happened goes to report.json in its
output folder; it exits 0.

argv: a JSON object {"scan": [addresses], "tcp": ["host:port"], "http":
["http://..."], "postgres_tcp": ["host:port"], "postgres_socket": path,
"udp": ["host:port"], "store": ["host:port"]}.
"""

import errno
import json
import os
import select
import socket
import struct
import sys
import time
import urllib.request

targets = json.loads(sys.argv[1])
out = os.environ["TRAINYARD_OUTPUT_DIR"]
report = {"open": {}, "tcp": {}, "http": {}, "postgres": {}, "udp": {}, "raw": None, "store": {}}


def scan(host, ports=range(1, 65536), batch=512):
    """Ports of `host` that accept a connection (nonblocking connects)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    found, errors = [], {}
    ports = list(ports)
    for i in range(0, len(ports), batch):
        pending = {}
        for p in ports[i : i + batch]:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)
            rc = s.connect_ex((host, p))
            if rc in (0, errno.EINPROGRESS):
                pending[s] = p
            else:
                errors[os.strerror(rc)] = errors.get(os.strerror(rc), 0) + 1
                s.close()
        deadline = time.time() + 2
        while pending and time.time() < deadline:
            _, w, _ = select.select([], list(pending), [], 0.2)
            for s in w:
                rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if rc == 0 and s.getsockname() == s.getpeername():
                    # A loopback connect to a free ephemeral port can pick
                    # that very port as its own: connected to itself.
                    errors["connected to itself"] = errors.get("connected to itself", 0) + 1
                elif rc == 0:
                    found.append(pending[s])
                else:
                    errors[os.strerror(rc)] = errors.get(os.strerror(rc), 0) + 1
                s.close()
                del pending[s]
        for s in pending:
            errors["no answer"] = errors.get("no answer", 0) + 1
            s.close()
    return {"open": found, "errors": errors}


for host in targets["scan"]:
    report["open"][host] = scan(host)


def attempt(f):
    try:
        return f()
    except Exception as e:  # the refusal is the result
        return f"refused: {e.__class__.__name__}: {e}"


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host.strip("[]"), int(port)), timeout=3)
    s.settimeout(3)
    return s


def tcp(addr):
    s = connect(addr)
    try:
        data = s.recv(64)
    except socket.timeout:
        data = None
    return "connected, then " + ("no answer" if data is None else f"{len(data)} bytes")


for addr in targets.get("tcp", []):
    report["tcp"][addr] = attempt(lambda: tcp(addr))


def http(url):
    with urllib.request.urlopen(url, timeout=3) as r:
        return f"answered {r.status}"


for url in targets.get("http", []):
    report["http"][url] = attempt(lambda: http(url))


def startup(sock):
    """Postgres's startup message as user postgres; what the server says."""
    body = b"user\0postgres\0database\0postgres\0\0"
    sock.sendall(struct.pack("!ii", len(body) + 8, 196608) + body)
    kind = sock.recv(1)
    if kind == b"R":
        (_, code) = struct.unpack("!ii", sock.recv(8))
        return "authenticated (trust)" if code == 0 else f"asked for a password ({code})"
    if kind == b"E":
        return "server error: " + sock.recv(256).decode(errors="replace")
    return f"answered {kind!r}"


for addr in targets.get("postgres_tcp", []):
    report["postgres"][addr] = attempt(lambda: startup(connect(addr)))
if targets.get("postgres_socket"):
    path = targets["postgres_socket"]

    def unix():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(path)
        return startup(s)

    report["postgres"][path] = attempt(unix)

for addr in targets.get("udp", []):
    host, port = addr.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    def udp():
        u = socket.socket(family, socket.SOCK_DGRAM)
        return f"sent {u.sendto(b'trainyard', (host, int(port)))} bytes"

    report["udp"][addr] = attempt(udp)


def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    return "opened"


report["raw"] = attempt(raw)


def store(addr):
    import datetime

    import torch.distributed as dist

    # Where nothing accepts a connection there is no store to speak to
    # (and TCPStore's own retries would only take longer to say so).
    connect(addr).close()
    host, port = addr.rsplit(":", 1)
    s = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=2))
    s.set("trainyard-attacker", "1")
    return "read " + repr(s.get("trainyard-attacker"))


for addr in targets.get("store", []):
    report["store"][addr] = attempt(lambda: store(addr))

os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f)
print("netscan done", flush=True)
