// SPDX-License-Identifier: Apache-2.0
// The exact text of `zinf tune`'s setup warnings.
#include "tune_checks.h"

#include <cerrno>

#include <gtest/gtest.h>

#include "format.h"

namespace zinf::tools {
namespace {

TEST(TuneChecks, DirectIoWarningNamesDirFileSystemAndErrno) {
  EXPECT_EQ(direct_io_warning("/mnt/ram", "tmpfs", EINVAL),
            "O_DIRECT refused on /mnt/ram (tmpfs: Invalid argument): zinf falls back to buffered "
            "I/O there, so these figures measure the page cache, not the drive");
}

TEST(TuneChecks, MemlockWarningOnlyBelowTheBudget) {
  EXPECT_EQ(memlock_warning(8u << 20, std::uint64_t{2} << 30),
            "memlock limit 8 MiB (RLIMIT_MEMLOCK) is below the pinned budget 2.0 GiB: io_uring "
            "buffer registration will be refused and I/O runs unregistered; raise it (ulimit -l, "
            "LimitMEMLOCK= in systemd, --ulimit memlock=-1 in docker)");
  EXPECT_EQ(memlock_warning(std::uint64_t{2} << 30, std::uint64_t{2} << 30), "");
}

TEST(TuneChecks, HugePageWarningOnlyWhenNever) {
  EXPECT_EQ(thp_warning("always madvise [never]"),
            "transparent huge pages are off ([never] in /sys/kernel/mm/transparent_hugepage/"
            "enabled): buffers use 4 KiB pages and 1 MiB transfers are split in two (reads "
            "1.3-2.6x slower on the reference machine)");
  EXPECT_EQ(thp_warning("always [madvise] never"), "");
}

TEST(TuneChecks, UringWarning) {
  EXPECT_EQ(uring_warning("io_uring_setup: EPERM"),
            "io_uring unavailable (io_uring_setup: EPERM): only the threads backend is measured");
}

TEST(TuneChecks, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 bytes");
  EXPECT_EQ(human_bytes(64u << 20), "64 MiB");
  EXPECT_EQ(human_bytes(std::uint64_t{3} << 29), "1.5 GiB");
}

}  // namespace
}  // namespace zinf::tools
