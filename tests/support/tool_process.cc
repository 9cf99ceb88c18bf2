// SPDX-License-Identifier: Apache-2.0
#include "support/tool_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace zinf::test {

ToolProcess spawn_tool(const std::string& tool, const std::vector<std::string>& args,
                       const std::function<void(pid_t)>& before_exec) {
  ToolProcess p;
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> all{tool};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out = ::memfd_create("zinf-tool-output", MFD_CLOEXEC);
  int go[2];
  if (out < 0 || ::pipe2(go, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "memfd_create/pipe2: " << std::strerror(errno);
    if (out >= 0) ::close(out);
    return p;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    ::close(out);
    ::close(go[0]);
    ::close(go[1]);
    return p;
  }
  if (pid == 0) {
    ::close(go[1]);
    char byte = 0;
    while (::read(go[0], &byte, 1) < 0 && errno == EINTR) {}
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(go[0]);
  if (before_exec) before_exec(pid);
  const char byte = 1;
  (void)!::write(go[1], &byte, 1);
  ::close(go[1]);
  p.pid = pid;
  p.out_fd = out;
  return p;
}

ToolEnd wait_tool(ToolProcess& p) {
  ToolEnd e;
  if (p.pid < 0) return e;
  int st = 0;
  while (::waitpid(p.pid, &st, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(st)) e.status = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) e.signal = WTERMSIG(st);
  char buf[4096];
  ssize_t n = 0;
  off_t at = 0;
  while ((n = ::pread(p.out_fd, buf, sizeof buf, at)) > 0) {
    e.out.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  ::close(p.out_fd);
  p.pid = -1;
  p.out_fd = -1;
  return e;
}

bool wait_for_handler(pid_t pid, int sig, int timeout_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    bool zombie = false;
    while (std::getline(f, line)) {
      if (line.rfind("State:", 0) == 0 && line.find('Z') != std::string::npos) zombie = true;
      if (line.rfind("SigCgt:", 0) == 0) {
        const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
        if ((mask >> (sig - 1)) & 1u) return true;
      }
    }
    if (zombie || !f.is_open()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

SignalledRun run_and_signal(const std::string& tool, const std::vector<std::string>& args, int sig,
                            int min_ms, int max_ms, std::uint64_t seed) {
  SignalledRun r;
  std::mt19937_64 rng(seed * 31 + static_cast<std::uint64_t>(sig));
  r.delay_ms = min_ms + static_cast<int>(rng() % static_cast<std::uint64_t>(max_ms - min_ms));
  ToolProcess p = spawn_tool(tool, args);
  r.pid = p.pid;
  if (p.pid < 0) return r;
  // SIGKILL has no handler; the tool's SIGTERM handler says it is past its start-up all the same.
  EXPECT_TRUE(wait_for_handler(p.pid, sig == SIGKILL ? SIGTERM : sig, 10000))
      << "the tool did not install its signal handlers";
  std::this_thread::sleep_for(std::chrono::milliseconds(r.delay_ms));
  ::kill(p.pid, sig);
  r.end = wait_tool(p);
  return r;
}

std::uint64_t signal_test_seed() {
  const char* env = std::getenv("ZINF_TEST_SEED");
  const std::uint64_t seed =
      env != nullptr && *env != '\0' ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::cout << "signal delays: ZINF_TEST_SEED=" << seed << " replays them\n";
  return seed;
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

Victims make_victims(const std::string& dir) {
  Victims v;
  v.dir = dir;
  v.existing = dir + "/victim";
  v.absent = dir + "/absent";
  v.content = "the victim's own bytes, which zinf must never touch\n";
  std::ofstream(v.existing) << v.content;
  return v;
}

void plant_links(const std::string& dir, const std::vector<std::string>& names, const Victims& v) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& target = i % 2 == 0 ? v.existing : v.absent;
    const std::string link = dir + "/" + names[i];
    if (::symlink(target.c_str(), link.c_str()) != 0) {
      ADD_FAILURE() << "symlink " << link << ": " << std::strerror(errno);
    }
  }
}

std::string victims_changed(const Victims& v) {
  std::ifstream f(v.existing);
  std::stringstream got;
  got << f.rdbuf();
  std::string what;
  if (got.str() != v.content) {
    what += v.existing + " was changed (" + std::to_string(got.str().size()) + " bytes now); ";
  }
  struct stat st {};
  if (::lstat(v.absent.c_str(), &st) == 0) what += v.absent + " was created; ";
  return what;
}

void expect_follows_no_probe_link(const std::string& tool, std::vector<std::string> args,
                                  const std::string& parent) {
  const std::string work = parent + "/work";
  ::mkdir(work.c_str(), 0700);
  const std::string victims = parent + "/victims";
  ::mkdir(victims.c_str(), 0700);
  const Victims v = make_victims(victims);
  args.push_back("--dir");
  args.push_back(work);
  std::vector<std::string> planted;
  ToolProcess p = spawn_tool(tool, args, [&](pid_t pid) {
    planted = {".zinf-write-probe-" + std::to_string(pid)};
    plant_links(work, planted, v);
  });
  const ToolEnd e = wait_tool(p);
  EXPECT_EQ(e.status, 0) << e.out;
  EXPECT_EQ(victims_changed(v), "");
  EXPECT_EQ(dir_entries(work), planted);
}

void expect_signals_stop_cleanly(const std::string& tool, const std::string& command,
                                 const std::vector<std::string>& args, const std::string& parent,
                                 int min_ms, int max_ms) {
  const std::uint64_t seed = signal_test_seed();
  const std::pair<int, const char*> signals[] = {
      {SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGHUP, "SIGHUP"}, {SIGKILL, "SIGKILL"}};
  std::istringstream words(command);
  std::vector<std::string> argv{std::istream_iterator<std::string>(words), {}};
  for (const auto& [sig, name] : signals) {
    const std::string dir = parent + "/" + name;
    ::mkdir(dir.c_str(), 0700);
    std::vector<std::string> a = argv;
    a.insert(a.end(), args.begin(), args.end());
    a.push_back("--dir");
    a.push_back(dir);
    const SignalledRun r = run_and_signal(tool, a, sig, min_ms, max_ms, seed);
    SCOPED_TRACE(std::string(name) + " after " + std::to_string(r.delay_ms) + " ms (seed " +
                 std::to_string(seed) + ")");
    if (sig == SIGKILL) {
      EXPECT_EQ(r.end.signal, SIGKILL) << r.end.out;
    } else {
      EXPECT_EQ(r.end.status, 128 + sig) << r.end.out;
      EXPECT_NE(r.end.out.find("zinf " + command + ": interrupted by " + name + "\n"),
                std::string::npos)
          << r.end.out;
    }
    const std::vector<std::string> left = dir_entries(dir);
    EXPECT_TRUE(left.empty()) << "left in " << dir << ": " << ::testing::PrintToString(left);
  }
}

BoundedRun run_bounded(const std::vector<std::string>& args, std::chrono::seconds limit,
                       std::chrono::milliseconds poll) {
  using Clock = std::chrono::steady_clock;
  BoundedRun run;
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto start = Clock::now();
  pid_t pid = -1;
  if (argv[0] == nullptr ||
      posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    ADD_FAILURE() << "cannot start " << (argv[0] ? argv[0] : "(no command)");
    return run;
  }
  while (Clock::now() - start < limit) {
    if (waitpid(pid, &run.status, WNOHANG) == pid) {
      run.ended = true;
      break;
    }
    std::this_thread::sleep_for(poll);
  }
  if (!run.ended) {
    kill(pid, SIGKILL);
    waitpid(pid, &run.status, 0);
  }
  run.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return run;
}

}  // namespace zinf::test
