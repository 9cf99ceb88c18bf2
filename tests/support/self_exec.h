// SPDX-License-Identifier: Apache-2.0
// Whether a test can start a fresh copy of its own executable, as GoogleTest's "threadsafe"
// death tests do (fork, then exec /proc/self/exe). Under a user-mode emulator such as
// qemu-user, which the aarch64 cross build runs its tests in (scripts/test-aarch64.sh), the
// exec of a foreign executable fails with ENOEXEC unless the host registered the emulator
// with binfmt_misc; forking without exec still works there.
#pragma once

#include <string>

namespace zinf::test {

/// Returns why this process cannot exec a fresh copy of itself ("exec of /proc/self/exe failed:
/// Exec format error ..."), or "" if it can. Found out once per process by trying: a forked
/// child execs this executable with a GoogleTest filter that matches no test.
const std::string& self_exec_unavailable_reason();

/// Sets GoogleTest's death test style to "threadsafe" (a fresh process per death test) where
/// this process can exec itself, else to "fast" (fork only), which runs the same statement and
/// checks the same exit but inherits this process's state: for death tests that prefer a fresh
/// process but do not depend on one. Tests that depend on one (the environment read at load)
/// skip with self_exec_unavailable_reason() instead.
void prefer_threadsafe_death_tests();

}  // namespace zinf::test
