#!/usr/bin/env python3
"""The include graph's floors (issue 32 "Layout"): every source folder has a floor, and a file may
include only headers of its own folder or of folders on a strictly lower floor. So no include
points up, two folders on one floor never include each other, and the folders form no cycle.
Within a folder, the headers must not include each other in a cycle either.

One rule beyond includes (issue 32, the cache's index and storage): a policy (kernels/policies,
examples/policies/cpp) reads a cache's rows only through the ops (kernels::ops::host_layer, or
ops that take the cache), never from the cache's storage itself: no KvCache::rows_f32,
host_rows, device_rows, storage_of or f16 row fields in its code (comments aside). Its hooks
see a `const KvIndex&` (kernels/kv_index.h), which has no rows to read.

usage: check_layering.py ROOT     prints "layering: ok (N files, M includes)" or the violations
                                  (file:line, the include, both floors) and exits 1.
"""
import os
import re
import sys

# Lowest first. kernels/ops declares the policy ops vocabulary: above kernels/cpu (whose functions
# its CPU instance is made of), below kernels/cuda (which implements its device instance) and
# below kernels/policies (which decide with it). workers/formats reads files into the engine's
# Model, so it stands above workers/engine, which includes no format. kernels/nccl stands above
# kernels/cuda, whose cuBLAS loader (cublas_api.h) its rank-order sum calls. kernels/formats (the
# safetensors reader and file helpers) stands below the policies, which read published tensors
# (qfilter), and below workers/formats, which loads checkpoints with it.
FLOORS = {
    "common": 0,
    "kernels": 1,
    "tasks": 1,
    "results": 1,
    "kernels/cpu": 2,
    "kernels/ops": 3,
    "kernels/formats": 3,  # safetensors and file reading: what policies and workers/formats read
    "kernels/cuda": 4,
    "kernels/nccl": 5,
    "kernels/policies": 5,
    "examples/policies/cpp": 6,  # a policy written by a user: what kernels/policies may include
    "workers/engine": 6,
    "workers/formats": 7,
    "workers/tokenizer": 8,
    "workers": 9,
    "harness": 10,
}
# Not checked: consumers of everything (tests, benches) and what holds no source of ours.
UNRANKED = ("tests", "bench", "build", "third_party", "models", "scripts", "configs", "cmake")
SOURCES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
POLICY_FOLDERS = ("kernels/policies", "examples/policies/cpp")
STORAGE = re.compile(r"\b(rows_f32|host_rows|device_rows|release_device_rows|set_device_rows|"
                     r"drop_host_rows|storage_of|keys16|values16|key16|value16)\b")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def folder_of(rel):
    return os.path.dirname(rel).replace(os.sep, "/")


def main(root):
    errors = []
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in UNRANKED]
            continue
        if rel_dir.startswith(UNRANKED):
            dirnames[:] = []
            continue
        for name in filenames:
            if name.endswith(SOURCES):
                files[rel_dir + "/" + name] = os.path.join(dirpath, name)
    n_includes = 0
    graph = {}
    for rel, path in sorted(files.items()):
        folder = folder_of(rel)
        if folder not in FLOORS:
            errors.append(f"{rel}: folder {folder} has no floor in {__file__} (give it one)")
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        graph[rel] = []
        if folder in POLICY_FOLDERS:
            code = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
            for m in STORAGE.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                errors.append(f"{rel}:{line}: a policy reads the cache's storage ({m.group(1)}); "
                              f"read rows through the ops (kernels::ops::host_layer)")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            target = folder_of(inc)
            if not target:
                continue  # a generated header beside the build (extra_policies.cc's list)
            n_includes += 1
            if target == folder:
                graph[rel].append(inc)
                continue
            if target not in FLOORS:
                if os.path.exists(os.path.join(root, inc)):
                    errors.append(f"{rel}:{line}: includes {inc}, of folder {target}, which has "
                                  f"no floor")
                continue  # a system or third-party header named by a path
            if FLOORS[target] >= FLOORS[folder]:
                errors.append(f"{rel}:{line}: includes {inc}: {folder} (floor {FLOORS[folder]}) "
                              f"may include only lower floors, {target} is on floor "
                              f"{FLOORS[target]}")
    # Cycles among the headers of one folder (depth-first search, colours).
    colour = {}

    def visit(node, stack):
        colour[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in graph:
                continue
            if colour.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                errors.append("include cycle: " + " -> ".join(cycle))
            elif colour.get(nxt) is None:
                visit(nxt, stack)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if colour.get(node) is None:
            visit(node, [])
    if errors:
        for e in errors:
            print("layering: " + e)
        print(f"layering: {len(errors)} violation(s)")
        return 1
    print(f"layering: ok ({len(files)} files, {n_includes} includes)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
