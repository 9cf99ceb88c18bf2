# SPDX-License-Identifier: Apache-2.0
"""The `zinf plan`, `bench io`, `stress` and `tune` samples in docs/*.md are what the build prints.

A sample is a fenced block whose first line is `$ zinf plan|bench io|stress|tune ...` (continued
with a trailing backslash); the lines after the command are its output, where a line `...`
stands for lines left out. The command runs in a scratch folder holding the files of FIXTURES
(the tune reports the samples name, by file name); `...` among its arguments stands for the
previous sample's arguments in the same document (a flag given again is kept once). Every shown
line must appear in the output, in order. Fails naming the document, the sample's line and the
first line that differs.

`zinf plan` is a pure computation: its lines must match exactly. The others measure the
machine, so their samples are checked for their form: each `--dir` becomes a scratch folder,
and in a shown line every number (a table cell: any figure, `-`, a `*` before it), every
sparkline and the values of the keys that describe the
file system (`fs=`, `direct=`, `huge_pages=`, `registered=`) stand for any such; the words,
the keys, the columns and their order must be the build's. A verdict of "no fall beyond the
noise" also accepts a fall, which a shared machine may show.

Usage: doc_samples.py ZINF_BINARY DOCS_DIR FIXTURES_DIR
"""

import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


COMMANDS = ("$ zinf plan", "$ zinf bench io", "$ zinf stress", "$ zinf tune")
MEASURED = ("bench", "stress", "tune")  # the samples checked for their form only
SPARK = "▁▂▃▄▅▆▇█"
NUMBER = r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?"
MACHINE_KEYS = ("fs", "direct", "huge_pages", "registered")
NO_FALL = "no fall beyond the noise"


def samples(doc):
    """(line number, command arguments, shown output lines) of each sample in `doc`."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    i, out = 0, []
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and \
                lines[i + 1].startswith(COMMANDS):
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


def form(line):
    """A regular expression for the printed lines that `line`, a measured sample's, stands for."""
    out, at = [], 0
    token = re.compile(rf"(?P<key>\b(?:{'|'.join(MACHINE_KEYS)})=\S+)|(?P<spark>[{SPARK}]+)|"
                       rf"(?P<cell>(?<!\S)\*?(?:{NUMBER}|-)(?!\S))|(?P<num>(?<![\w.]){NUMBER}(?![\w.]))|(?P<space>\s+)|"
                       rf"(?P<verdict>{re.escape(NO_FALL)})")
    for m in token.finditer(line):
        out.append(re.escape(line[at:m.start()]))
        if m.group("key"):
            out.append(re.escape(m.group("key").split("=")[0]) + r"=\S+")
        elif m.group("spark"):
            out.append(f"[{SPARK}]+")
        elif m.group("cell"):
            out.append(rf"\*?(?:{NUMBER}|-)")
        elif m.group("num"):
            out.append(NUMBER)
        elif m.group("space"):
            out.append(r"\s+")
        else:
            out.append(f"(?:{re.escape(NO_FALL)}|fell from .*)")
        at = m.end()
    out.append(re.escape(line[at:]))
    return re.compile("".join(out))


def scratch_dirs(args, work):
    """`args` with every `--dir` value replaced by a fresh folder under `work`."""
    out = list(args)
    for k in range(len(out) - 1):
        if out[k] == "--dir":
            out[k + 1] = tempfile.mkdtemp(prefix="dir", dir=work)
    return out


def check(zinf, doc, found, work):
    errors, previous = [], None
    for line, args, shown in found:
        args = expand(args, previous)
        previous = args
        measured = args[0] in MEASURED
        if measured:
            args = scratch_dirs(args, work)
        r = subprocess.run([zinf] + args, cwd=work, capture_output=True, text=True, check=False)
        printed = (r.stdout + r.stderr).splitlines()
        where = f"{doc.name}:{line}"
        if r.returncode != 0:
            errors.append(f"{where}: `zinf {' '.join(args)}` exited {r.returncode}: "
                          f"{(r.stderr or r.stdout).strip()[:300]}")
            continue
        at = 0
        for want in (s.strip() if measured else s.rstrip() for s in shown):
            if want == "..." or not want:
                continue
            if measured:
                pattern = form(want)
                found = next((k for k in range(at, len(printed))
                              if pattern.fullmatch(printed[k].strip())), None)
            else:
                found = next((k for k in range(at, len(printed))
                              if printed[k].rstrip() == want), None)
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
        print("doc_samples: no `$ zinf` sample found under", docs, file=sys.stderr)
        return 1
    for e in errors:
        print("doc_samples:", e, file=sys.stderr)
    if errors:
        return 1
    print(f"doc_samples: {count} `zinf plan|bench io|stress|tune` samples match what the build prints")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
