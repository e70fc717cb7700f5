#!/usr/bin/env bash
# The C reader (rose_aot/bundle/_fastread.c) under AddressSanitizer and UndefinedBehaviorSanitizer:
# builds it with both into a copy of the package and runs the tests that feed it every shipped
# cubin, thousands of damaged cubins, hostile indexes and the seeded fuzz. Any out-of-bounds
# read, overflow or undefined shift ends the run with the sanitizer's report (exit != 0).
#
#   bash tests/asan_fastread.sh          # CPU machine; ~2-3 min (the tests build the shipped bundle)
#
# Needs a C compiler with libasan and libubsan (gcc does), and the interpreter's headers.
set -euo pipefail
cd "$(dirname "$0")/.."
python="$("${PYTHON:-python}" -c "import sys; print(sys.executable)")"  # absolute: we cd below
cc="${CC:-cc}"
asan="$("$cc" -print-file-name=libasan.so)"
ubsan="$("$cc" -print-file-name=libubsan.so)"
for lib in "$asan" "$ubsan"; do
    [ -f "$lib" ] || { echo "asan_fastread.sh: $cc has no $(basename "$lib")" >&2; exit 1; }
done
read -r include suffix < <("$python" -c "import sysconfig as s; print(s.get_paths()['include'], s.get_config_var('EXT_SUFFIX'))")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r rose_aot tests manifests "$work/"
rm -f "$work"/rose_aot/bundle/_fastread*.so
"$cc" -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -fPIC -shared -I"$include" \
    rose_aot/bundle/_fastread.c -o "$work/rose_aot/bundle/_fastread$suffix"
cd "$work"
# PYTHONMALLOC=malloc: Python's own allocator carves small objects out of arenas that ASan
# sees as one block, so an overflow of a bytes object would go unseen (checked by hand: a read
# planted 64 bytes past a cubin is reported with it, not without).
export LD_PRELOAD="$asan:$ubsan" ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc PYTHONPATH="$work"
# The sanitized module, not an installed one, is what the tests must import.
"$python" -c "import sys, rose_aot.bundle.cubin as c
assert c._fastread is not None and c._fastread.__file__.startswith(sys.argv[1]), c._fastread" "$work"
"$python" -m pytest -q -p no:cacheprovider tests/test_bundle_cubin.py tests/test_bundle_format.py \
    tests/test_fuzz.py
echo "asan_fastread.sh: no sanitizer report"
