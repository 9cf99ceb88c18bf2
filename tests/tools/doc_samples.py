# SPDX-License-Identifier: Apache-2.0
"""The `zinf plan` samples in docs/*.md are what the build prints.

A sample is a fenced block whose first line is `$ zinf plan ...` (continued with a trailing
backslash); the lines after the command are its output, where a line `...` stands for lines
left out. The command runs in a scratch folder holding the files of FIXTURES (the tune reports
the samples name, by file name); `...` among its arguments stands for the previous sample's
arguments in the same document (a flag given again is kept once). Every shown line must appear
in the output, in order. Fails naming the document, the sample's line and the first line that
differs. (`zinf plan` is a pure computation; the other commands' samples carry measurements.)

Usage: doc_samples.py ZINF_BINARY DOCS_DIR FIXTURES_DIR
"""

import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile


def samples(doc):
    """(line number, command arguments, shown output lines) of each plan sample in `doc`."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    i, out = 0, []
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and \
                lines[i + 1].startswith("$ zinf plan"):
            start = i + 2  # 1-based line of the command
            j = i + 1
            command = lines[j][len("$ zinf "):]
            while command.endswith("\\"):
                j += 1
                command = command[:-1] + " " + lines[j].strip()
            shown = []
            j += 1
            while j < len(lines) and not lines[j].startswith("```"):
                shown.append(lines[j])
                j += 1
            out.append((start, shlex.split(command), shown))
            i = j + 1
        else:
            i += 1
    return out


def expand(args, previous):
    if "..." not in args:
        return args
    if previous is None:
        raise ValueError("'...' in the first sample's command: nothing to stand for")
    at = args.index("...")
    rest = args[at + 1:]
    kept, k = [], 1  # previous[0] is the subcommand, which args[:at] has too
    while k < len(previous):
        a = previous[k]
        has_value = k + 1 < len(previous) and not previous[k + 1].startswith("--")
        if a.startswith("--") and a in rest:  # given again: the sample's own occurrence wins
            k += 2 if has_value else 1
            continue
        kept.append(a)
        k += 1
    return args[:at] + kept + rest


def check(zinf, doc, found, work):
    errors, previous = [], None
    for line, args, shown in found:
        args = expand(args, previous)
        previous = args
        r = subprocess.run([zinf] + args, cwd=work, capture_output=True, text=True, check=False)
        printed = (r.stdout + r.stderr).splitlines()
        where = f"{doc.name}:{line}"
        if r.returncode != 0:
            errors.append(f"{where}: `zinf {' '.join(args)}` exited {r.returncode}: "
                          f"{(r.stderr or r.stdout).strip()[:300]}")
            continue
        at = 0
        for want in (s.rstrip() for s in shown):
            if want == "..." or not want:
                continue
            found = next((k for k in range(at, len(printed)) if printed[k].rstrip() == want),
                         None)
            if found is None:
                near = next((p for p in printed[at:] if p[:12] == want[:12]), "nothing like it")
                errors.append(f"{where}: the sample shows\n    {want}\n  the build prints\n"
                              f"    {near}")
                break
            at = found + 1
    return errors


def main(argv):
    zinf, docs, fixtures = (pathlib.Path(a).resolve() for a in argv[1:4])
    with tempfile.TemporaryDirectory() as work:
        for f in fixtures.iterdir():
            shutil.copy(f, work)
        errors, count = [], 0
        for doc in sorted(docs.glob("*.md")):
            found = samples(doc)
            count += len(found)
            errors += check(str(zinf), doc, found, work)
    if count == 0:
        print("doc_samples: no `$ zinf plan` sample found under", docs, file=sys.stderr)
        return 1
    for e in errors:
        print("doc_samples:", e, file=sys.stderr)
    if errors:
        return 1
    print(f"doc_samples: {count} `zinf plan` samples match what the build prints")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
