#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# protoc-c for the nested .proto tree of the rate limit API, flattened:
# meson's generated files cannot live in subdirectories, so this runs
# protoc-c into a temporary directory and copies every NAME.pb-c.[ch]
# into OUTDIR with its #include "a/b/NAME.pb-c.h" lines made flat.
# usage: protogen.py PROTOC_C OUTDIR PROTO_PATH... -- FILE.proto...
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main(argv):
    protoc, outdir = argv[1], argv[2]
    sep = argv.index('--')
    paths, files = argv[3:sep], argv[sep + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [protoc] + ['--proto_path=' + p for p in paths]
        cmd += ['--c_out=' + tmp] + files
        subprocess.run(cmd, check=True)
        inc = re.compile(r'#include "(?:[^"]*/)?([^"/]+\.pb-c\.h)"')
        for root, _, names in os.walk(tmp):
            for n in names:
                with open(os.path.join(root, n)) as f:
                    text = inc.sub(r'#include "\1"', f.read())
                with open(os.path.join(outdir, n), 'w') as f:
                    f.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
