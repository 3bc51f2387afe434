"""Writes, as JSON into the file argv[1], the operators of this libtorch's
registry that reach files or other processes: every schema with an argument
named `filename` or `path` of type str, and every operator of the
namespaces that open process groups or shared memory. The executor's
screen (executor/src/roles/screen.rs) must refuse each of them."""

import json
import sys

import torch

PROCESS_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "symm_mem", "_dtensor")
found = set()
for s in torch._C._jit_get_all_schemas():
    ns, _, op = s.name.partition("::")
    files = any(
        a.name in ("filename", "path") and "str" in str(a.type) for a in s.arguments
    )
    if files or ns in PROCESS_NAMESPACES or ns == "debugprims":
        found.add((ns, op))
json.dump(sorted(found), open(sys.argv[1], "w"))
