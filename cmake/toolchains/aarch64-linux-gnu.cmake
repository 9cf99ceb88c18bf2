# SPDX-License-Identifier: Apache-2.0
# Cross build for 64-bit Arm Linux with Debian's cross toolchain (g++-aarch64-linux-gnu), tests
# run under qemu-user (qemu-aarch64): the `aarch64` preset and scripts/test-aarch64.sh use it.
#
# Libraries come from the aarch64 sysroot only (/usr/aarch64-linux-gnu): Debian installs no
# arm64 builds of liburing, Nettle or GoogleTest next to the host's (no multiarch here), so the
# preset turns off what needs them and tests/CMakeLists.txt builds GoogleTest from its sources.
# The header-only dependencies (Boost, nlohmann-json, CLI11) are the host's, in /usr/include,
# which the cross compiler does not search: -idirafter puts that directory after every
# directory of the sysroot, so a header the sysroot has (glibc's, libstdc++'s) always wins and
# only what exists nowhere else is taken from /usr/include.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_C_FLAGS_INIT "-idirafter /usr/include")
set(CMAKE_CXX_FLAGS_INIT "-idirafter /usr/include")

# ctest (and gtest_discover_tests at build time) run every test executable through qemu; -L
# gives it the sysroot's dynamic loader and shared libraries.
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64;-L;/usr/aarch64-linux-gnu")

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
# Headers and CMake packages: the sysroot first, then the host's header-only packages
# (Boost's and nlohmann-json's CMake files describe headers only, no libraries).
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config would otherwise report the host's x86-64 libraries (Nettle for the CLI) as found.
set(ENV{PKG_CONFIG_LIBDIR} /usr/aarch64-linux-gnu/lib/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
