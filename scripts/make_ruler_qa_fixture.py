#!/usr/bin/env python3
"""Reference values for RULER's qa_1 / qa_2 generator (tasks/ruler_qa.h, tests/unit/test_ruler_qa.cc)
from RULER's own code, run on the hand-made corpora in tests/fixtures/tasks/ruler_qa.

RULER's functions read_squad, read_hotpotqa and generate_input_output and its DOCUMENT_PROMPT
are taken from RULER's scripts/data/synthetic/qa.py (pinned: NVIDIA/RULER c3f5e3b) with `ast`
and run unchanged; the template and answer prefix are TASKS['qa'] of its constants.py, joined as
prepare.py does for model_template_type=base; the answer prefix is cut off as generate_samples
does. RULER's tokenizer-driven search for the document count is not run: the cases fix it
(document counts below a question's gold count are left out: RULER's code raises there).
Recorded per case: the input text and answer prefix, the outputs, and the numbers k of the
"Document k:" blocks holding a gold document (where the seeded random.Random(seed).shuffle put
them). Also random.Random(seed).shuffle permutations (CPython's Mersenne Twister).

No packages beyond the standard library (Python 3.11.7 made the committed file). Run:
  git -C RULER show c3f5e3b:scripts/data/synthetic/qa.py > /tmp/qa.py
  git -C RULER show c3f5e3b:scripts/data/synthetic/constants.py > /tmp/constants.py
  python3 scripts/make_ruler_qa_fixture.py /tmp/qa.py /tmp/constants.py
Writes tests/fixtures/tasks/ruler_qa/expected.json.
"""
import ast
import json
import os
import platform
import random
import sys
from types import SimpleNamespace

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
fixtures = os.path.join(root, "tests", "fixtures", "tasks", "ruler_qa")
SEED = 42  # RULER's --random_seed default


def ruler_namespace(qa_py, constants_py):
    ns = {"json": json, "random": random, "os": os}
    tree = ast.parse(open(qa_py).read())
    for node in tree.body:
        keep = isinstance(node, ast.FunctionDef) and node.name in (
            "read_squad", "read_hotpotqa", "generate_input_output")
        keep = keep or (isinstance(node, ast.Assign) and
                        any(getattr(t, "id", "") == "DOCUMENT_PROMPT" for t in node.targets))
        if keep:
            exec(compile(ast.Module([node], []), qa_py, "exec"), ns)
    consts = {}
    exec(compile(open(constants_py).read(), constants_py, "exec"), consts)
    qa = consts["TASKS"]["qa"]
    ns["ANSWER_PREFIX"] = qa["answer_prefix"]
    ns["args"] = SimpleNamespace(random_seed=SEED, template=qa["template"] + qa["answer_prefix"])
    return ns


def cases(ns, reader, corpus, num_docs_list):
    ns["QAS"], ns["DOCS"] = ns[reader](os.path.join(fixtures, corpus))
    random.seed(SEED)
    out = []
    for index in range(len(ns["QAS"])):
        for num_docs in num_docs_list:
            if num_docs < len(ns["QAS"][index]["context"]):
                continue  # RULER raises (random.sample of a negative count)
            text, answer = ns["generate_input_output"](index, num_docs)
            cut = text.rfind(ns["ANSWER_PREFIX"][:10])  # generate_samples
            gold = [ns["DOCS"][g] for g in ns["QAS"][index]["context"]]
            positions = []
            k = 1
            while True:
                head = ns["DOCUMENT_PROMPT"].format(i=k, document="")
                at = text.find(head)
                if at < 0:
                    break
                for g in gold:
                    if text.startswith(ns["DOCUMENT_PROMPT"].format(i=k, document=g), at) and (
                            text[at + len(head) + len(g):].startswith("\n\n")):
                        positions.append(k)
                k += 1
            out.append({"index": index, "num_docs": num_docs, "input": text[:cut],
                        "answer_prefix": text[cut:], "outputs": answer,
                        "gold_documents": positions})
    return out


def main():
    ns = ruler_namespace(sys.argv[1], sys.argv[2])
    shuffles = []
    for seed in (42, 0, 7, 2**40 + 3):
        for n in (1, 2, 3, 7, 17, 100, 300):
            x = list(range(n))
            random.Random(seed).shuffle(x)
            shuffles.append({"seed": seed, "n": n, "order": x})
    fixture = {
        "python": platform.python_version(),
        "ruler": "NVIDIA/RULER c3f5e3b scripts/data/synthetic/qa.py",
        "seed": SEED,
        "shuffle": shuffles,
        "squad": cases(ns, "read_squad", "squad_tiny.json", [1, 2, 3, 4, 5, 9]),
        "hotpotqa": cases(ns, "read_hotpotqa", "hotpotqa_tiny.json", [2, 3, 4, 6, 9, 20]),
    }
    with open(os.path.join(fixtures, "expected.json"), "w") as f:
        json.dump(fixture, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
