#!/usr/bin/env python3
"""`make thread-safety`: Clang's thread-safety analysis (-Wthread-safety
-Werror) over every C++ translation unit of a configured build.

The GUARDED_BY / REQUIRES / EXCLUDES annotations (src/common/mutex.h) are only
checked by Clang; the project builds with GCC. This runs clang++ with
-fsyntax-only (the analysis runs while parsing; nothing is compiled or linked)
on the exact command of each entry of BUILD/compile_commands.json, so it
needs no second build tree, and prints every finding with its file and line.
Exit status: 0 none, 1 findings (or a file clang could not parse), 2 bad usage.
docs/architecture.md, "Layering enforced"; docs/testing.md.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

# GCC options clang does not take (none of them change what is analysed).
DROP = {"-fno-semantic-interposition", "-fconcepts", "-fno-gnu-unique",
        "-fvect-cost-model=dynamic"}  # src/opt (GCC's vectorizer only)


def clang_command(entry, clang):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    while args and (os.path.basename(args[0]) in ("ccache", "sccache")):
        args = args[1:]
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a in DROP:
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
            "-Wno-unknown-warning-option"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="configured build dir (compile_commands.json)")
    ap.add_argument("--clang", default=shutil.which("clang++-14") or shutil.which("clang++") or "",
                    help="clang++ to use (default: clang++-14, else clang++)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--filter", default="", help="only files whose path matches this regex")
    ap.add_argument("--exclude", default="",
                    help="skip files whose path matches this regex (`make test` skips the tests)")
    args = ap.parse_args()
    db = os.path.join(args.build, "compile_commands.json")
    if not os.path.exists(db):
        print("thread_safety.py: %s is missing: configure the build first (make configure)" % db,
              file=sys.stderr)
        return 2
    if not args.clang:
        print("thread_safety.py: no clang++ found (Debian: apt-get install clang-14)",
              file=sys.stderr)
        return 2
    # The analysis must fire on a known violation (annotations on for clang).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    probe = ("#include \"common/mutex.h\"\n"
             "struct Probe { memento::Mutex mu; int x GUARDED_BY(mu) = 0;\n"
             "  void Unlocked() { x = 1; } };\n")
    p = subprocess.run([args.clang, "-std=c++17", "-fsyntax-only", "-Wthread-safety",
                        "-Werror=thread-safety", "-I", os.path.join(root, "src"), "-I",
                        os.path.join(root, "include"), "-x", "c++", "-"],
                       input=probe, capture_output=True, text=True)
    if p.returncode == 0 or "-Wthread-safety" not in p.stderr:
        print("thread_safety.py: the analysis does not fire on an unlocked write of a "
              "GUARDED_BY field (src/common/mutex.h):\n" + p.stderr, file=sys.stderr)
        return 1
    entries = [e for e in json.load(open(db))
               if e["file"].endswith((".cc", ".cpp")) and re.search(args.filter, e["file"])
               and not (args.exclude and re.search(args.exclude, e["file"]))]
    seen, todo = set(), []
    for e in entries:  # one run per source file (a file can be in two targets)
        if e["file"] not in seen:
            seen.add(e["file"])
            todo.append(e)

    def run(e):
        p = subprocess.run(clang_command(e, args.clang), cwd=e["directory"],
                           capture_output=True, text=True)
        return e["file"], p.returncode, p.stderr

    findings, failed = 0, []
    print("thread-safety: analysing %d file(s) with %s, %d at a time"
          % (len(todo), args.clang, max(1, args.jobs)), flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for done, (path, rc, err) in enumerate(pool.map(run, todo), 1):
            if done % 25 == 0:
                print("thread-safety: %d/%d files" % (done, len(todo)), flush=True)
            n = len(re.findall(r"\[-Werror,-Wthread-safety[^\]]*\]", err))
            if rc != 0:
                findings += n
                failed.append(path)
                sys.stdout.write(err)
    print("thread-safety: %d file(s) analysed, %d finding(s) in %d file(s)"
          % (len(todo), findings, len(failed)))
    for f in failed:
        print("  " + os.path.relpath(f))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
