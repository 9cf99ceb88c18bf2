// SPDX-License-Identifier: Apache-2.0
// Dir and File's exclusive creators: names resolved under one directory descriptor, links,
// FIFOs and pre-created entries never followed or adopted, unnamed files leave nothing behind,
// durable replacement, and the flock that names its holder.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "support/child_process.h"
#include "support/private_tmpfs.h"
#include "support/test_dir.h"
#include "zinf/common/error.h"
#include "zinf/swap/dir.h"
#include "zinf/swap/file.h"

namespace zinf::swap {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A file outside the scratch directory that a planted link points at: must never change.
struct Victim {
  test::TestDir outside;
  std::string path = outside.file("victim");
  Victim() { write_text(path, "precious"); }
  void expect_untouched() const { EXPECT_EQ(read_text(path), "precious"); }
};

TEST(Dir, OpenRefusesEmptyMissingAndNonDirectory) {
  test::TestDir dir;
  EXPECT_THROW(Dir::open(""), IoError);
  try {
    Dir::open(dir.file("missing"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), ENOENT);
    EXPECT_NE(std::string(e.what()).find(dir.file("missing")), std::string::npos) << e.what();
  }
  write_text(dir.file("f"), "x");
  try {
    Dir::open(dir.file("f"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(e.sys_errno(), ENOTDIR);
  }
}

TEST(Dir, CreateChildRefusesAnythingAlreadyThere) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::symlink(victim.outside.path().c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::mkdir(dir.file("pre").c_str(), 0700), 0);
  for (const char* name : {"link", "pre"}) {
    try {
      d.create_child(name);
      FAIL() << name;
    } catch (const IoError& e) {
      EXPECT_EQ(e.sys_errno(), EEXIST) << name;
      EXPECT_NE(std::string(e.what()).find(dir.file(name)), std::string::npos) << e.what();
    }
  }
  const Dir child = d.create_child("new");
  EXPECT_EQ(child.path(), dir.file("new"));
  EXPECT_TRUE(fs::is_directory(dir.file("new")));
}

TEST(Dir, OpenChildNeverFollowsALink) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::symlink(victim.outside.path().c_str(), dir.file("link").c_str()), 0);
  try {
    d.open_child("link");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_TRUE(e.sys_errno() == ELOOP || e.sys_errno() == ENOTDIR) << e.what();
  }
  EXPECT_THROW(d.open_child("../x"), UsageError);
}

// reopen() goes through the descriptor, not the path: after the directory was moved and a link
// planted at its old name, the new descriptor still names the directory first opened, and it
// has a lock of its own.
TEST(Dir, ReopenIsTheDirectoryOpenedNotWhatIsAtItsPathNow) {
  test::TestDir dir;
  Victim victim;
  const std::string first = dir.subdir("first");
  const Dir d = Dir::open(first);
  fs::rename(first, dir.file("moved"));
  ASSERT_EQ(::symlink(victim.outside.path().c_str(), first.c_str()), 0);
  const Dir again = d.reopen();
  EXPECT_EQ(again.path(), first);  // for messages
  create_file_durably(again, "note", "x");
  EXPECT_TRUE(fs::exists(dir.file("moved") + "/note"));
  EXPECT_FALSE(fs::exists(victim.outside.file("note")));
  victim.expect_untouched();
  ASSERT_TRUE(d.try_lock());
  EXPECT_FALSE(again.try_lock());  // its own open file description, so its own flock
}

TEST(Dir, RemoveTreeRemovesLinksNotTheirTargets) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  {
    const Dir v = d.create_child("v");
    write_text(v.path_of("a"), "a");
    ASSERT_EQ(::symlink(victim.outside.path().c_str(), v.path_of("out").c_str()), 0);
    v.create_child("sub");
    write_text(v.path_of("sub") + "/b", "b");
  }
  EXPECT_TRUE(d.remove_tree("v"));
  EXPECT_FALSE(fs::exists(dir.file("v")));
  EXPECT_FALSE(d.remove_tree("v"));
  victim.expect_untouched();
  EXPECT_TRUE(fs::exists(victim.outside.path()));
}

TEST(File, CreateUnnamedLeavesNoNameBehind) {
  test::TestDir dir;
  const Dir d = Dir::open(dir.path());
  {
    File f = File::create_unnamed(d, "zinf-swap-0",
                                  FileOptions{.direct = false, .preallocate_bytes = 1 << 20});
    EXPECT_TRUE(f.is_open());
    EXPECT_EQ(f.size(), 1u << 20);
    EXPECT_NE(f.path().find(dir.file("zinf-swap-0")), std::string::npos) << f.path();
    EXPECT_NE(f.path().find("unlinked"), std::string::npos) << f.path();
    EXPECT_TRUE(entries(dir.path()).empty()) << "the file has a name while open";
    const char data[] = "round trip";
    ASSERT_EQ(::pwrite(f.fd(), data, sizeof data, 0), static_cast<ssize_t>(sizeof data))
        << std::strerror(errno);
  }
  EXPECT_TRUE(entries(dir.path()).empty());
}

TEST(Dir, OpenUnnamedIsQuietAndNamesWhatFailed) {
  test::TestDir dir;
  const Dir d = Dir::open(dir.path());
  Status failure;
  {
    const UniqueFd fd = d.open_unnamed(O_RDWR | O_CLOEXEC, "probe", failure);
    EXPECT_TRUE(fd.valid()) << failure.to_string();
    EXPECT_TRUE(failure.ok());
    EXPECT_TRUE(entries(dir.path()).empty());
  }
  // A file without a name cannot be read-only: the kernel says EINVAL, nothing is thrown.
  const UniqueFd bad = d.open_unnamed(O_RDONLY | O_CLOEXEC, "probe", failure);
  EXPECT_FALSE(bad.valid());
  EXPECT_EQ(failure.sys_errno(), EINVAL);
  EXPECT_EQ(failure.to_string(), "open failed: probe: Invalid argument (EINVAL)");
  EXPECT_TRUE(entries(dir.path()).empty());
}

TEST(File, CreateUnnamedLeavesNothingWhenTheProcessIsKilled) {
  test::TestDir dir;
  test::Child child([&](const std::function<void()>& ready) {
    const Dir d = Dir::open(dir.path());
    File f = File::create_unnamed(d, "x", FileOptions{.preallocate_bytes = 4096});
    ready();
    for (;;) ::pause();
  });
  ASSERT_TRUE(child.ready());
  // Killed without a chance to clean up: the kernel drops the file with its descriptor.
  child.kill_and_reap();
  EXPECT_TRUE(entries(dir.path()).empty());
}

TEST(File, CreateExclusiveRefusesLinksAndExistingFiles) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::symlink(victim.path.c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::symlink(dir.file("dangling-target").c_str(), dir.file("dangling").c_str()), 0);
  write_text(dir.file("there"), "x");
  for (const char* name : {"link", "dangling", "there"}) {
    try {
      File::create_exclusive(d, name, FileOptions{.direct = false});
      FAIL() << name;
    } catch (const IoError& e) {
      EXPECT_EQ(e.sys_errno(), EEXIST) << name;
      EXPECT_NE(std::string(e.what()).find(dir.file(name)), std::string::npos) << e.what();
    }
  }
  victim.expect_untouched();
  EXPECT_FALSE(fs::exists(dir.file("dangling-target")));
  File f = File::create_exclusive(d, "fresh", FileOptions{.direct = false});
  EXPECT_EQ(f.path(), dir.file("fresh"));
}

TEST(File, OpenExistingRefusesFifoLinkAndDirectoryWithoutBlocking) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink(victim.path.c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::mkdir(dir.file("dir").c_str(), 0700), 0);
  for (const char* name : {"fifo", "link", "dir"}) {
    try {
      File::open_existing(d, name, FileOptions{.read_only = true});
      FAIL() << name;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.file(name)), std::string::npos) << e.what();
    }
  }
  try {
    File::open_existing(d, "fifo", FileOptions{.read_only = true});
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("a FIFO"), std::string::npos) << e.what();
  }
  write_text(dir.file("regular"), "x");
  File f = File::open_existing(d, "regular", FileOptions{.read_only = true, .direct = false});
  EXPECT_EQ(f.size(), 1u);
  EXPECT_FALSE(f.is_direct());
  // Direct I/O is switched on after the checks, where the file system has it.
  File g = File::open_existing(d, "regular", FileOptions{.read_only = true});
  EXPECT_EQ(g.is_direct(), test::supports_direct_io(dir.path()));
  if (g.is_direct()) {
    EXPECT_GE(g.alignment(), 512u);
  }
}

TEST(Dir, ReplaceFileDurablyReplacesALinkInsteadOfWritingThroughIt) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::symlink(victim.path.c_str(), dir.file("LATEST").c_str()), 0);
  replace_file_durably(d, "LATEST", "v2\n");
  victim.expect_untouched();
  EXPECT_FALSE(fs::is_symlink(dir.file("LATEST")));
  EXPECT_EQ(read_text(dir.file("LATEST")), "v2\n");
  EXPECT_EQ(entries(dir.path()), std::set<std::string>{"LATEST"}) << "a temporary was left";
}

// A full disk fails the temporary file that replace_file_durably writes first; the error names
// the file the caller asked for (zinf tune --plot, --out), not only the temporary one (a
// private 64 KiB tmpfs).
TEST(Dir, ReplaceFileDurablyOnAFullDiskNamesTheFileAskedFor) {
  test::TestDir dir;
  const std::string mnt = dir.subdir("small");
  ZINF_EXPECT_IN_PRIVATE_TMPFS(mnt, "64k", [&] {
    try {
      replace_file_durably(Dir::open(mnt), "plot.svg", std::string(1 << 20, 'x'));
      return 1;
    } catch (const IoError& e) {
      const std::string what = e.what();
      if (e.code() != ErrorCode::kNoSpace) return 2;
      if (what.find(mnt + "/plot.svg") == std::string::npos) return 3;
      if (what.find("temporary file") == std::string::npos) return 4;
      return 0;
    }
  });
}

TEST(Dir, CreateFileDurablyRefusesAnythingAtTheName) {
  test::TestDir dir;
  Victim victim;
  const Dir d = Dir::open(dir.path());
  create_file_durably(d, "manifest", "text\n");
  EXPECT_EQ(read_text(dir.file("manifest")), "text\n");
  ASSERT_EQ(::symlink(victim.path.c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  for (const char* name : {"manifest", "link", "fifo"}) {
    try {
      create_file_durably(d, name, "new");
      ADD_FAILURE() << name << " was written";
    } catch (const IoError& e) {
      EXPECT_EQ(e.sys_errno(), EEXIST) << e.what();
      EXPECT_EQ(e.status().path(), dir.file(name));
    }
  }
  victim.expect_untouched();
  EXPECT_EQ(read_text(dir.file("manifest")), "text\n");
}

TEST(Dir, ListNamesEveryEntryEachTime) {
  test::TestDir dir;
  const Dir d = Dir::open(dir.path());
  EXPECT_TRUE(d.list().empty());
  write_text(dir.file("a"), "x");
  ASSERT_EQ(::mkdir(dir.file("b").c_str(), 0700), 0);
  ASSERT_EQ(::symlink("/nonexistent", dir.file("c").c_str()), 0);
  for (int round = 0; round < 2; ++round) {  // a second listing starts from the beginning
    const auto names = d.list();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()),
              (std::set<std::string>{"a", "b", "c"}));
  }
}

TEST(Dir, ReadSmallFileRefusesSpecialFilesAndBoundsTheSize) {
  test::TestDir dir;
  const Dir d = Dir::open(dir.path());
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_THROW(read_small_file(d, "fifo", 1024), IoError);
  write_text(dir.file("big"), std::string(2000, 'x'));
  try {
    read_small_file(d, "big", 1024);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  }
  EXPECT_EQ(read_small_file(d, "big", 4096).size(), 2000u);
}

TEST(Dir, UniqueNamesDifferAndCarryThePrefix) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string n = unique_name("p-");
    EXPECT_TRUE(n.starts_with("p-" + std::to_string(::getpid()) + "-")) << n;
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_TRUE(is_zinf_temporary(".zinf-tmp-1-2"));
  EXPECT_FALSE(is_zinf_temporary("LATEST"));
}

TEST(Dir, SecondLockFailsNamingTheHolder) {
  test::TestDir dir;
  const Dir a = Dir::open(dir.path());
  const Dir b = Dir::open(dir.path());
  a.lock_or_throw("a checkpoint");
  EXPECT_FALSE(b.try_lock());
  try {
    b.lock_or_throw("a checkpoint");
    FAIL();
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir.path()), std::string::npos) << what;
    EXPECT_NE(what.find("zinf process " + std::to_string(::getpid())), std::string::npos) << what;
  }
}

TEST(Dir, LockOfAKilledProcessIsFreeAtOnce) {
  test::TestDir dir;
  test::Child child([&](const std::function<void()>& ready) {
    const Dir d = Dir::open(dir.path());
    if (!d.try_lock()) return;
    ready();
    for (;;) ::pause();
  });
  ASSERT_TRUE(child.ready()) << "the child could not lock";
  const Dir d = Dir::open(dir.path());
  EXPECT_FALSE(d.try_lock());
  EXPECT_EQ(d.holder_pid(), child.pid());
  child.kill_and_reap();
  EXPECT_TRUE(d.try_lock());
}

}  // namespace
}  // namespace zinf::swap
