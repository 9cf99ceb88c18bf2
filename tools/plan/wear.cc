// SPDX-License-Identifier: Apache-2.0
#include "wear.h"

#include <fcntl.h>
#include <linux/nvme_ioctl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

// A 16-byte little-endian counter as a double (exact below 2^53).
double le128(std::span<const std::uint8_t, 512> page, std::size_t at) {
  double v = 0;
  for (std::size_t i = 16; i-- > 0;) v = v * 256.0 + page[at + i];
  return v;
}

constexpr double kDataUnit = 512.0 * 1000.0;  // the specification's "data unit"

}  // namespace

WearEstimate estimate_wear(double write_bytes_per_step, double step_seconds, double tbw_bytes) {
  if (!(write_bytes_per_step > 0) || !(step_seconds > 0) || !(tbw_bytes > 0)) {
    throw UsageError("estimate_wear: bytes per step, step time and rated endurance must be > 0");
  }
  WearEstimate w;
  w.bytes_per_day = write_bytes_per_step * (86400.0 / step_seconds);
  w.days_to_rated = tbw_bytes / w.bytes_per_day;
  w.days_per_percent = w.days_to_rated / 100.0;
  return w;
}

NvmeSmartLog parse_nvme_smart_log(std::span<const std::uint8_t, 512> page) {
  NvmeSmartLog log;
  log.percentage_used = page[5];
  log.bytes_read = le128(page, 32) * kDataUnit;
  log.bytes_written = le128(page, 48) * kDataUnit;
  return log;
}

std::optional<NvmeSmartLog> read_nvme_smart_log(const std::string& device, std::string* why) {
  const int fd = ::open(device.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *why = "open " + device + ": " + std::strerror(errno);
    return std::nullopt;
  }
  alignas(4096) std::array<std::uint8_t, 512> page{};
  nvme_admin_cmd cmd{};
  cmd.opcode = 0x02;  // Get Log Page
  cmd.nsid = 0xffffffff;  // the controller as a whole
  cmd.addr = reinterpret_cast<std::uint64_t>(page.data());
  cmd.data_len = page.size();
  // CDW10: log identifier 02h (SMART / Health) and the number of dwords minus one (127).
  cmd.cdw10 = 0x02u | ((page.size() / 4 - 1) << 16);
  const int rc = ::ioctl(fd, NVME_IOCTL_ADMIN_CMD, &cmd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    *why = rc < 0 ? "NVMe Get Log Page on " + device + ": " + std::strerror(err) +
                        " (not an NVMe device, or not allowed)"
                  : "NVMe Get Log Page on " + device + ": status " + std::to_string(rc);
    return std::nullopt;
  }
  return parse_nvme_smart_log(std::span<const std::uint8_t, 512>(page));
}

}  // namespace zinf::tools
