#!/usr/bin/env bash
# Build the C extensions (rose_aot/loader/_native.c, rose_aot/bundle/_fastread.c) in place for
# another CPython version than the one `pip install -e .` built them for: the GPU machine runs
# CPython 3.12 from a copy of this tree, with no compiler step of its own. The .so files are
# git-ignored; carry them.
#
#   bash benchmarks/build_native.sh 3.12   # -> rose_aot/{loader/_native,bundle/_fastread}.cpython-312-*.so
#
# Needs that CPython (python3.12 on PATH, or under pyenv) with its headers, and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: build_native.sh PYTHON_VERSION (e.g. 3.12)}"
case "$version" in [0-9].[0-9]|[0-9].[0-9][0-9]) ;; *) echo "build_native.sh: '$version' is not a version like 3.12" >&2; exit 2 ;; esac
python=""
# (a pyenv shim is on PATH for every version but runs only the selected ones)
if "python$version" -c "" 2> /dev/null; then python="$(command -v "python$version")"; fi
if [ -z "$python" ] && command -v pyenv > /dev/null; then
    python="$(ls -d "$(pyenv root)"/versions/"$version"*/bin/python"$version" 2> /dev/null | tail -1 || true)"
fi
[ -n "$python" ] || { echo "build_native.sh: no python$version found (PATH or pyenv)" >&2; exit 1; }
read -r include suffix < <("$python" -c "import sysconfig as s; print(s.get_paths()['include'], s.get_config_var('EXT_SUFFIX'))")
[ -f "$include/Python.h" ] || { echo "build_native.sh: $python has no headers ($include/Python.h)" >&2; exit 1; }
for source in rose_aot/loader/_native.c rose_aot/bundle/_fastread.c; do
    out="${source%.c}$suffix"
    "${CC:-cc}" -O2 -Wall -Wextra -Wno-unused-parameter -Wno-cast-function-type \
        -Wno-missing-field-initializers -fPIC -shared -I"$include" "$source" -o "$out"
    echo "built $out with $python"
done
