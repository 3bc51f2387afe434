"""A hostile script job: it tries what a stranger's code should never do
from inside its sandbox and writes what happened to report.json in its
output folder (so the test reads each attempt's result), then exits 0.
argv: a JSON object {"read": [paths], "api": "http://host:port"}."""

import json
import os
import socket
import sys
import urllib.request

targets = json.loads(sys.argv[1])
out = os.environ["TRAINYARD_OUTPUT_DIR"]
report = {"read": {}, "env": sorted(os.environ)}

for path in targets["read"]:
    try:
        with open(path, "rb") as f:
            report["read"][path] = "read " + f.read(64).hex()
    except OSError as e:
        report["read"][path] = f"denied: {e.__class__.__name__}"

try:
    listing = os.listdir(os.path.dirname(os.environ["TRAINYARD_INPUT_DIR"].rstrip("/")) + "/..")
    report["list_parent"] = f"listed {len(listing)}"
except OSError as e:
    report["list_parent"] = f"denied: {e.__class__.__name__}"

report["system"] = os.system("id > /dev/null 2>&1")

# Processes: at most the sandbox's limit.
children, err = [], None
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.__class__.__name__
        break
    if pid == 0:
        import time

        time.sleep(30)
        os._exit(0)
    children.append(pid)
report["forked"] = len(children)
report["fork_error"] = err
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)

try:
    with urllib.request.urlopen(targets["api"] + "/v1/jobs", timeout=5) as r:
        report["api"] = f"answered {r.status}"
except urllib.error.HTTPError as e:
    report["api"] = f"refused {e.code}"
except OSError as e:
    report["api"] = f"unreachable: {e}"

try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0trainyard-abstract")
    report["abstract_socket"] = "connected"
except OSError as e:
    report["abstract_socket"] = f"denied: {e.__class__.__name__}"

os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f)
print("hostile script done", flush=True)
