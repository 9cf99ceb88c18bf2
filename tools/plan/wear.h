// SPDX-License-Identifier: Apache-2.0
// Drive wear: an offloaded optimizer rewrites its whole state every step (12 bytes per
// parameter), so a consumer SSD's rated endurance (TBW) can be used up in days. This says how
// long, from the planned bytes written per step and the step time, and reads what the drive
// itself reports (the NVMe SMART / health log: percentage used, data written) where it may.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace zinf::tools {

/// What one node's drives go through at a planned rate.
struct WearEstimate {
  double bytes_per_day = 0;      ///< written, at the step rate
  double days_to_rated = 0;      ///< until `tbw_bytes` is written
  double days_per_percent = 0;   ///< to use 1% of it
};

/// `write_bytes_per_step` at one step every `step_seconds` against a rated endurance of
/// `tbw_bytes` (10^12 bytes per TB, as drives are rated). All must be > 0.
WearEstimate estimate_wear(double write_bytes_per_step, double step_seconds, double tbw_bytes);

/// The fields of the NVMe SMART / Health Information log page (log identifier 02h, 512 bytes)
/// that wear is judged by.
struct NvmeSmartLog {
  std::uint8_t percentage_used = 0;  ///< byte 5: the vendor's estimate of life used (may pass 100)
  /// Bytes 48-63, "data units written": thousands of 512-byte units, i.e. 512,000 bytes each.
  /// Kept as a double of bytes: 2^128 is far beyond any drive, 2^53 bytes (9 PB) is exact.
  double bytes_written = 0;
  double bytes_read = 0;  ///< bytes 32-47, "data units read", the same way
};

/// Parses a SMART / Health log page as the NVMe base specification lays it out (little endian).
NvmeSmartLog parse_nvme_smart_log(std::span<const std::uint8_t, 512> page);

/// Reads the SMART / Health log of the NVMe controller or namespace `device` ("/dev/nvme0",
/// "/dev/nvme0n1") with the admin Get Log Page command. Needs read access to the device and
/// CAP_SYS_ADMIN on most kernels; otherwise, or for a device that is not NVMe (a virtual disk),
/// returns std::nullopt and sets `why` (e.g. "open /dev/nvme0: Permission denied").
std::optional<NvmeSmartLog> read_nvme_smart_log(const std::string& device, std::string* why);

}  // namespace zinf::tools
