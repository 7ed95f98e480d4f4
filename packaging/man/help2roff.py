#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write a program's manual page (roff, man macros) from its --help.

The help text is the manual's one source, so the two cannot drift. Two
layouts are read:

- the manual's own: NAME, SYNOPSIS, DESCRIPTION, OPTIONS ... at column
  0, their text indented 4, an option's text indented 8 (allotd,
  allotctl);
- the GNU one: "usage: PROG ...", a paragraph, then a table of options
  ("  -s, --scenario NAME   what it does", continued deeper), under
  "Section:" headings or not, as allot-agentd, allot-sim and
  allot-loadgen print it; NAME comes from --name.

help2man reads only the second (it puts the first under DESCRIPTION)
and txt2man fails on brackets in SYNOPSIS lines, hence this.

usage: help2roff.py --section N --name "prog - what it is"
                    --version V PROGRAM > prog.N
"""
import argparse
import re
import subprocess
import sys

# Sections whose entries are a tag (an option, a command, a signal, a
# variable) and its text: the rest are prose or examples.
TAGGED = re.compile(r"(OPTIONS|COMMANDS|SIGNALS|ENVIRONMENT)$")
PREFORMATTED = ("SYNOPSIS", "EXAMPLE", "EXAMPLES")


def esc(text):
    """roff text: backslashes escaped, a leading control character
    neutralised."""
    text = text.replace("\\", "\\e")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def tag(text):
    """A tag in bold, its hyphens the minus sign man pages use for
    options."""
    return "\\fB" + esc(text).replace("-", "\\-") + "\\fR"


def indent(line):
    return len(line) - len(line.lstrip(" "))


def man_layout(lines, out):
    """The manual's own layout, section by section."""
    section = None
    for line in lines:
        if not line.strip():
            if section not in PREFORMATTED:
                out.append(".PP")
            else:
                out.append("")
            continue
        if indent(line) == 0:
            if section in PREFORMATTED:
                out.append(".fi")
            section = line.strip()
            out.append(".SH " + esc(section.upper()))
            if section in PREFORMATTED:
                out.append(".nf")
            continue
        body = line[4:] if indent(line) >= 4 else line.lstrip()
        if section in PREFORMATTED:
            out.append(esc(body))
        elif (section and TAGGED.search(section) and
              indent(line) == 4):
            # "--opt ARG" alone, or "name   text" on one line.
            m = re.match(r"(\S.*?)(?:\s{2,}(\S.*))?$", body)
            out.append(".TP")
            out.append(tag(m.group(1)))
            if m.group(2):
                out.append(esc(m.group(2)))
        else:
            out.append(esc(body.strip()))
    if section in PREFORMATTED:
        out.append(".fi")


def is_heading(line, after):
    """A few words at column 0 ending in a colon, the options of a
    section next ("Targets:", then "  -t, --target URL ...")."""
    if indent(line) or not re.match(r"[A-Z][\w ]{0,30}:$", line.rstrip()):
        return False
    nxt = next((l for l in after if l.strip()), "")
    return nxt.strip().startswith("-") and indent(nxt) <= 6


def gnu_layout(lines, name, out):
    """usage:, a paragraph, a table of options."""
    out.append(".SH NAME")
    out.append(esc(name).replace(" - ", " \\- ", 1))
    usage = lines[0].split(":", 1)[1].strip()
    out.append(".SH SYNOPSIS")
    out.append(".nf")
    out.append(esc(usage))
    out.append(".fi")
    out.append(".SH DESCRIPTION")
    in_opts = False
    in_rows = False  # inside an option's table (an indented list)
    prose = False  # the last line written was prose after the options
    rest = lines[1:]
    for i, line in enumerate(rest):
        if not line.strip():
            prose = False
            continue
        stripped = line.strip()
        row = re.match(r"(\S+)(?:\s{2,}(\S.*))?$", stripped)
        if in_rows and not (indent(line) > 6):
            out += [".PD", ".RE"]
            in_rows = False
        if is_heading(line, rest[i + 1:]):
            # "Targets:" over options: a subsection of OPTIONS.
            if not in_opts:
                out.append(".SH OPTIONS")
                in_opts = True
            out.append(".SS " + esc(stripped[:-1]))
        elif stripped.startswith("-") and indent(line) <= 6:
            if not in_opts:
                out.append(".SH OPTIONS")
                in_opts = True
            m = re.match(r"(-\S*(?:,? -\S+)*(?: [^\s-]\S*)?)(?:\s{2,}(.*))?$",
                         stripped)
            out.append(".TP")
            out.append(tag(m.group(1) if m else stripped))
            if m and m.group(2):
                out.append(esc(m.group(2)))
        elif in_opts and 6 < indent(line) <= 10 and row:
            # A row of a table under an option ("name=NAME  what"): an
            # indented tagged list of its own.
            if not in_rows:
                out += [".RS", ".PD 0"]
                in_rows = True
            out.append(".TP 20")
            out.append(tag(row.group(1)))
            if row.group(2):
                out.append(esc(row.group(2)))
        elif in_opts and indent(line) > 6:
            out.append(esc(stripped))
        else:
            if in_opts and not prose:
                out.append(".PP")
            prose = in_opts
            out.append(esc(stripped))
    if in_rows:
        out += [".PD", ".RE"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", required=True)
    ap.add_argument("--name", required=True,
                    help='"prog - what it is", for the GNU layout')
    ap.add_argument("--version", required=True)
    ap.add_argument("program")
    a = ap.parse_args()
    run = subprocess.run([a.program, "--help"], capture_output=True,
                         text=True)
    text = run.stdout or run.stderr
    if run.returncode != 0 or not text.strip():
        sys.exit("help2roff: %s --help failed (%d)" % (a.program,
                                                        run.returncode))
    lines = text.rstrip("\n").split("\n")
    prog = a.name.split(" - ", 1)[0]
    out = ['.TH %s %s "" "allot %s" "allot"' % (
        prog.upper(), a.section, a.version)]
    if lines[0].strip() == "NAME":
        man_layout(lines, out)
    elif lines[0].lower().startswith("usage:"):
        gnu_layout(lines, a.name, out)
    else:
        sys.exit("help2roff: %s --help starts with neither NAME nor "
                 "usage:" % a.program)
    # Paragraph marks where nothing follows them add only warnings.
    clean = []
    for line in out:
        if line == ".PP" and clean and clean[-1] in (".PP", ".TP") or \
                line == ".PP" and clean and clean[-1].startswith(".SH"):
            continue
        clean.append(line)
    while clean and clean[-1] == ".PP":
        clean.pop()
    sys.stdout.write("\n".join(clean) + "\n")


if __name__ == "__main__":
    main()
