#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Package.InstallsAndBuildsConsumer: installs a build tree to a temporary prefix, moves the
# prefix (the installed files must be relocatable), checks what was installed (files, no
# build/source paths, exported symbols, headers free of liburing/CUDA), then builds
# examples/consumer against it with find_package and the C example with pkg-config, and runs
# them (they check their own results).
# Usage: package_test.sh <build dir> <source dir> <cmake> <generator> <c compiler>
#        <c++ compiler> <sanitize flags or "">
set -euo pipefail
build=$1 src=$2 cmake=$3 generator=$4 cc=$5 cxx=$6 sanitize=${7:-}

tmp=$(mktemp -d "${ZINF_TEST_DIR:-${TMPDIR:-/tmp}}/zinf-package-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== install $build"
"$cmake" --install "$build" --prefix "$tmp/staged" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
mv "$tmp/staged" "$tmp/prefix"   # relocated: nothing may still point at "staged"
p=$tmp/prefix

for f in bin/zinf lib/libzinf.so lib/libzinf.so.0 include/zinf.h include/zinf/config.h \
         include/zinf/offload/engine.h include/zinf/offload/config.h include/zinf/cuda/device.h \
         include/zinf/adam/cpu_adam.h include/zinf/common/element_type.h \
         include/zinf/common/error.h lib/cmake/zinf/zinfConfig.cmake \
         lib/cmake/zinf/zinfConfigVersion.cmake lib/cmake/zinf/zinfTargets.cmake \
         lib/pkgconfig/zinf.pc; do
  [ -e "$p/$f" ] || fail "not installed: $f"
done

echo "== relocatable: no absolute build, source or staging paths in installed text files"
for path in "$(cd "$build" && pwd)" "$(cd "$src" && pwd)" "$tmp/staged"; do
  if grep -rIl --exclude-dir=bin -F "$path" "$p"; then fail "installed files name $path"; fi
done
if readelf -d "$p/lib/libzinf.so" | grep -E 'RPATH|RUNPATH'; then fail "libzinf.so has an rpath"; fi

echo "== public headers include no liburing, CUDA or NCCL header"
if grep -rnE '#include *[<"](liburing|cuda_runtime|cuda|nccl)' "$p/include" | grep -v cuda_interop.h; then
  fail "a public header includes a third-party header"
fi

echo "== the tool's own dependencies (CLI11, Nettle) are not the package's"
if grep -rniE 'cli11|nettle' "$p/lib/cmake" "$p/lib/pkgconfig" "$p/include"; then
  fail "the CMake package, zinf.pc or a header names CLI11 or Nettle"
fi
if readelf -d "$p/lib/libzinf.so" | grep -i nettle; then fail "libzinf.so links Nettle"; fi

echo "== exported symbols: the zinf namespace and the zinf_ C API only"
bad=$(nm -D --defined-only "$p/lib/libzinf.so" | awk '{print $3}' | c++filt |
      grep -vE '^(zinf_|zinf::|typeinfo (name )?for zinf::|vtable for zinf::|VTT for zinf::|(non-)?virtual thunk to zinf::|guard variable for zinf::)' |
      grep -vE '^(_init|_fini|_edata|_end|__bss_start)$' || true)
[ -z "$bad" ] || fail "unexpected exported symbols:
$(echo "$bad" | head -20)"
# grep without -q: -q exits at the first match, nm then dies of SIGPIPE and pipefail fails the
# pipeline although the symbol is there.
nm -D --defined-only "$p/lib/libzinf.so" | grep ' T zinf_engine_create$' >/dev/null ||
  fail "zinf_engine_create not exported"

flags=""
[ -n "$sanitize" ] && flags="-fsanitize=$sanitize"

echo "== examples/consumer with find_package(zinf)"
"$cmake" -S "$src/examples/consumer" -B "$tmp/consumer" -G "$generator" \
  -DCMAKE_PREFIX_PATH="$p" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_BUILD_TYPE=Release \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure consumer"; }
"$cmake" --build "$tmp/consumer" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build consumer"; }
"$tmp/consumer/engine_example" || fail "engine_example"
"$tmp/consumer/c_example" || fail "c_example"

echo "== the C example with pkg-config"
export PKG_CONFIG_PATH=$p/lib/pkgconfig
[ "$(pkg-config --modversion zinf)" = "$(sed -n 's/.*ZINF_VERSION "\(.*\)"/\1/p' "$p/include/zinf/config.h")" ] ||
  fail "pkg-config --modversion zinf: $(pkg-config --modversion zinf)"
# shellcheck disable=SC2046  # word splitting of pkg-config's output is intended
"$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror $flags "$src/examples/consumer/c_example.c" \
  -o "$tmp/c_example_pc" $(pkg-config --cflags --libs zinf) -lm -Wl,-rpath,"$p/lib"
"$tmp/c_example_pc" || fail "c_example built with pkg-config"

if [ -z "$sanitize" ] && python3 -c 'import ctypes' 2>/dev/null; then
  echo "== dlopen from Python ctypes"
  python3 - "$p/lib/libzinf.so" <<'PY' || fail "ctypes"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.zinf_version.restype = ctypes.c_char_p
lib.zinf_last_error.restype = ctypes.c_char_p
engine = ctypes.c_void_p()
status = lib.zinf_engine_create(b"{", None, 0, None, ctypes.byref(engine))
assert status == 1, status  # ZINF_ERR_USAGE
assert lib.zinf_last_error(), "empty message"
print("ctypes: zinf", lib.zinf_version().decode(), "->", lib.zinf_last_error().decode())
PY
fi
echo "package test: ok"
