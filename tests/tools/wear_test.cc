// SPDX-License-Identifier: Apache-2.0
// Drive wear: the estimate against figures worked by hand, the SMART / Health log page parsed
// as the NVMe specification lays it out (a page built byte by byte here: this machine has no
// NVMe device to capture one from), and the reader's refusals naming the device.
#include "wear.h"

#include <array>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

// 7B parameters with NVMe optimizer state write 84 GB per step (12 bytes each); at 30 s a step
// that is 2880 steps a day, 241.92 TB; a 600 TB drive lasts 600 / 241.92 = 2.48 days.
TEST(Wear, EstimateMatchesTheHandComputedFigures) {
  const WearEstimate w = estimate_wear(84e9, 30.0, 600e12);
  EXPECT_DOUBLE_EQ(w.bytes_per_day, 84e9 * 2880);
  EXPECT_NEAR(w.days_to_rated, 600e12 / 241.92e12, 1e-12);
  EXPECT_NEAR(w.days_per_percent * 24, 0.5952, 1e-3);  // hours per 1%
  EXPECT_THROW(estimate_wear(0, 30, 600e12), UsageError);
  EXPECT_THROW(estimate_wear(84e9, 0, 600e12), UsageError);
}

TEST(Wear, SmartLogFieldsAreReadWhereTheSpecificationPutsThem) {
  std::array<std::uint8_t, 512> page{};
  page[5] = 37;  // percentage used
  // Data units read (bytes 32-47) = 0x0102 = 258; written (48-63) = 0x01_0000_0000 = 2^32.
  page[32] = 0x02;
  page[33] = 0x01;
  page[52] = 0x01;
  const NvmeSmartLog log = parse_nvme_smart_log(std::span<const std::uint8_t, 512>(page));
  EXPECT_EQ(log.percentage_used, 37);
  EXPECT_DOUBLE_EQ(log.bytes_read, 258.0 * 512000);
  EXPECT_DOUBLE_EQ(log.bytes_written, 4294967296.0 * 512000);
}

TEST(Wear, ReaderRefusesWhatIsNotAnNvmeDeviceNamingIt) {
  std::string why;
  EXPECT_FALSE(read_nvme_smart_log("/nonexistent/nvme9", &why).has_value());
  EXPECT_EQ(why, "open /nonexistent/nvme9: No such file or directory");
  why.clear();
  EXPECT_FALSE(read_nvme_smart_log("/dev/null", &why).has_value());
  EXPECT_NE(why.find("/dev/null"), std::string::npos) << why;
}

}  // namespace
}  // namespace zinf::tools
