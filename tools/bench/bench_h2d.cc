// SPDX-License-Identifier: Apache-2.0
// `zinf bench h2d`: the host <-> device copy rate through the device layer, from pinned
// (registered) host memory and, for comparison, from pageable memory, over a sweep of sizes.
// On a consumer GPU every parameter byte goes NVMe -> pinned -> PCIe, so this rate matters as
// much as the drive's; the prefetcher's window and the planner's step bound depend on it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "format.h"
#include "json_out.h"
#include "zinf/common/error.h"
#include "zinf/cuda/device.h"
#include "zinf/swap/buffer_pool.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kAbout = R"(
Measures host -> device and device -> host copies through zinf's device layer: from pinned
host memory (one huge-page arena registered with the device, as zinf's staging is) and, for
comparison, from pageable memory, for each --sizes entry. Each figure is the median of
--repeat copies of that size on one stream, timed from enqueue to the stream's completion.
On the host simulation (no GPU, or --device host) the "device" is host memory and a copy is a
memcpy by the stream's worker, capped by --copy-gbps if given: the figures are those of the
simulation's copy path, not of a PCIe link, and the output says so.)";

constexpr const char* kFooter = R"(
On CUDA, pinned copies should reach the PCIe link's rate (about 25 GB/s per direction on
PCIe 4.0 x16, 50 on 5.0) at 16 MiB and above; pageable ones are staged through a driver
buffer and usually run at a fraction of that.)";

struct Config {
  cuda::DeviceKind device = cuda::DeviceKind::kAuto;
  std::vector<std::uint64_t> sizes;
  std::uint64_t repeat = 5;
  double copy_gbps = 0;
  bool json = false;
};

std::vector<std::uint64_t> parse_sizes(const std::string& text) {
  std::vector<std::uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::uint64_t v = parse_size(item, "--sizes");
    if (v == 0) throw UsageError("invalid --sizes: a size of 0 in '" + text + "'");
    out.push_back(v);
  }
  if (out.empty()) throw UsageError("invalid --sizes: no size in '" + text + "'");
  return out;
}

Config parse(const std::vector<std::string>& tokens, bool* help) {
  Config c;
  std::string device = "auto", sizes = "64K,1M,16M,256M";
  Cli cli("bench h2d", kAbout, kFooter);
  cli.text("--device", device, "KIND", "auto | cuda | host");
  cli.text("--sizes", sizes, "LIST", "comma-separated copy sizes, e.g. 4K,1M,64M");
  cli.count("--repeat", c.repeat, "copies per size and kind; the median is reported", 1, 1000);
  cli.number("--copy-gbps", c.copy_gbps,
             "host device only: copy bandwidth cap in GB/s per direction (0 = none)");
  cli.flag("--json", c.json, "one JSON object on stdout instead of the table");
  *help = !cli.parse(tokens);
  if (*help) return c;
  c.device = cuda::parse_device_kind(device);
  c.sizes = parse_sizes(sizes);
  if (!(c.copy_gbps >= 0)) throw UsageError("invalid --copy-gbps: must be >= 0");
  return c;
}

struct Row {
  std::uint64_t bytes = 0;
  double h2d_pinned = 0, d2h_pinned = 0, h2d_pageable = 0, d2h_pageable = 0;  // GB/s
};

// The median GB/s of `repeat` copies of `host` <-> `dev` in one direction.
double measure(cuda::Device& device, cuda::StreamRef stream, std::span<std::byte> host,
               const cuda::DeviceBuffer& dev, bool to_device, std::uint64_t repeat) {
  std::vector<double> rates;
  for (std::uint64_t r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    if (to_device) {
      device.copy_to_device(stream, dev.span(0, host.size()), host);
    } else {
      device.copy_to_host(stream, host, dev.span(0, host.size()));
    }
    device.synchronize(stream);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(static_cast<double>(host.size()) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int bench_h2d_main(const std::vector<std::string>& args) {
  bool help = false;
  const Config cfg = parse(args, &help);
  if (help) return 0;
  cuda::DeviceOptions o;
  o.kind = cfg.device;
  o.host_copy_bandwidth_gbps = cfg.copy_gbps;
  std::unique_ptr<cuda::Device> device = cuda::make_device(o);
  const bool simulated = device->kind() == cuda::DeviceKind::kHost;
  if (!simulated && cfg.copy_gbps > 0) {
    throw UsageError("--copy-gbps is for the host simulation; " + std::string(device->name()) +
                     " copies at the link's rate");
  }
  const std::uint64_t largest = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());

  swap::BufferPoolOptions bo;
  bo.budget_bytes = largest;
  bo.huge_pages = true;
  bo.prefault = true;
  swap::BufferPool pool(bo);
  cuda::PinnedRegistration pinned = device->register_host(pool.arena());
  swap::BufferLease pinned_buf = pool.acquire(largest);
  std::vector<std::byte> pageable(largest);
  std::memset(pinned_buf.data(), 0x5a, largest);
  std::memset(pageable.data(), 0xa5, largest);
  cuda::DeviceBuffer dev = device->allocate(largest);
  cuda::Stream stream = device->create_stream();

  std::vector<Row> rows;
  for (std::uint64_t bytes : cfg.sizes) {
    Row r;
    r.bytes = bytes;
    const std::span<std::byte> p(pinned_buf.data(), bytes);
    const std::span<std::byte> q(pageable.data(), bytes);
    // One untimed copy each way first: the first touch of the device pages is not the rate.
    (void)measure(*device, stream, p, dev, true, 1);
    r.h2d_pinned = measure(*device, stream, p, dev, true, cfg.repeat);
    r.d2h_pinned = measure(*device, stream, p, dev, false, cfg.repeat);
    r.h2d_pageable = measure(*device, stream, q, dev, true, cfg.repeat);
    r.d2h_pageable = measure(*device, stream, q, dev, false, cfg.repeat);
    rows.push_back(r);
  }

  const std::string note =
      simulated ? "host simulation: the figures are its copy path (a memcpy by the stream's "
                  "worker" +
                      std::string(cfg.copy_gbps > 0 ? ", capped" : "") +
                      "), not a PCIe link; run with --device cuda on a GPU machine"
                : "";
  if (cfg.json) {
    Json j;
    j["bench"] = "h2d";
    j["device"] = std::string(device->name());
    j["simulated"] = simulated;
    if (simulated) j["copy_gbps_cap"] = cfg.copy_gbps;
    j["repeat"] = cfg.repeat;
    Json list = Json::array();
    for (const Row& r : rows) {
      Json e;
      e["bytes"] = r.bytes;
      e["h2d_pinned_gbps"] = r.h2d_pinned;
      e["d2h_pinned_gbps"] = r.d2h_pinned;
      e["h2d_pageable_gbps"] = r.h2d_pageable;
      e["d2h_pageable_gbps"] = r.d2h_pageable;
      list.push_back(e);
    }
    j["sizes"] = list;
    if (simulated) j["note"] = note;
    std::printf("%s\n", json_text(j).c_str());
    return 0;
  }
  std::printf("zinf bench h2d: device %s, median of %llu copies per figure (GB/s)\n",
              std::string(device->name()).c_str(), static_cast<unsigned long long>(cfg.repeat));
  if (simulated) std::printf("note: %s\n", note.c_str());
  std::printf("%10s %12s %12s %14s %14s\n", "size", "h2d pinned", "d2h pinned", "h2d pageable",
              "d2h pageable");
  for (const Row& r : rows) {
    std::printf("%10s %12.2f %12.2f %14.2f %14.2f\n", human_bytes(r.bytes).c_str(), r.h2d_pinned,
                r.d2h_pinned, r.h2d_pageable, r.d2h_pageable);
  }
  return 0;
}

}  // namespace zinf::tools
