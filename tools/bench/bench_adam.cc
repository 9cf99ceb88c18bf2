// SPDX-License-Identifier: Apache-2.0
// `zinf bench adam`: times CpuAdam steps on arrays far larger than the caches and reports
// elements/s and GB/s; with --reference it alternates each step with the StreamRmw memory
// kernel (a[i] += s*b[i]) on arrays of the same length, so the ratio to what memory delivers
// is measured in the same run, under the same noise.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench_common.h"
#include "args.h"
#include "commands.h"
#include "interrupt.h"
#include "json_out.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/adam/reference_kernels.h"
#include "zinf/common/error.h"

namespace zinf::tools {
namespace {

using adam::CopyOut;
using adam::CpuAdam;
using adam::GradView;
using adam::StreamRmw;

constexpr const char* kAbout =
    "Times --steps CpuAdam steps (after one untimed warm-up) over --numel elements of fp32\n"
    "parameters and moments and reports the median. Bytes moved per element: 24 for parameters\n"
    "and moments (read and written) plus the gradient read (4 fp32, 2 bf16/fp16) plus the\n"
    "copy-out write (2). --reference alternates each step with the read-modify-write kernel\n"
    "a[i] += s*b[i] and reports its GB/s, the bound GB/s / 28 in elements/s, and the ratio to it\n"
    "(medians; also fastest step against fastest pass, which preemption on a shared machine\n"
    "cannot skew).";

constexpr std::size_t kAdamFp32BytesPerElement = 28;  // the unit: p, m, v r+w, g read

template <typename Fn>
double time_seconds(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return seconds_since(t0);
}

// What the timed steps (and the memory kernel's passes, with --reference) come to.
struct AdamFigures {
  std::size_t bytes_per_element = 0;
  double sec = 0, eps = 0, gbps = 0, best_sec = 0;
  double rmw_gbps = 0, bound_eps = 0, ratio = 0, ratio_best = 0;  // --reference only

  AdamFigures(std::size_t n, std::size_t grad_bytes, bool copy_out,
              const std::vector<double>& adam_s, const std::vector<double>& rmw_s) {
    bytes_per_element = 24 + grad_bytes + (copy_out ? 2 : 0);
    sec = median(adam_s);
    eps = static_cast<double>(n) / sec;
    gbps = eps * static_cast<double>(bytes_per_element) / 1e9;
    best_sec = *std::min_element(adam_s.begin(), adam_s.end());
    if (!rmw_s.empty()) {
      rmw_gbps = static_cast<double>(n) * StreamRmw::kBytesPerElement / median(rmw_s) / 1e9;
      bound_eps = rmw_gbps * 1e9 / kAdamFp32BytesPerElement;
      ratio = eps / bound_eps;
      // Fastest step against fastest pass: on a shared machine, preemption only ever adds
      // time, so the minima show what the kernels can do when they have the cores.
      const double rmw_best = *std::min_element(rmw_s.begin(), rmw_s.end());
      ratio_best = (best_sec > 0 ? rmw_best / best_sec : 0) * kAdamFp32BytesPerElement /
                   StreamRmw::kBytesPerElement;
    }
  }
};

// What was run, as the report names it.
struct AdamRun {
  const CpuAdam& adam;
  std::size_t n;
  ElementType grad_dtype;
  const std::string& copy_text;
  ArrayLayout layout;
  std::uint64_t steps;
  bool reference;
};

// The JSON object (--json) or the table.
void report(const AdamRun& r, const AdamFigures& f, bool json) {
  const std::string isa(adam::isa_name(r.adam.isa()));
  const adam::PrefetchSetting prefetch = r.adam.prefetch();
  const std::string gt(element_type_name(r.grad_dtype));
  if (json) {
    Json j;
    j["bench"] = "adam";
    j["isa"] = isa;
    j["threads"] = std::uint64_t{r.adam.threads()};
    j["prefetch_elements"] = std::uint64_t{prefetch.elements};
    j["prefetch_source"] = std::string(prefetch.source);
    j["numel"] = std::uint64_t{r.n};
    j["grad_dtype"] = gt;
    j["copy_out"] = r.copy_text;
    j["layout"] = std::string(array_layout_name(r.layout));
    j["steps"] = r.steps;
    j["seconds_per_step"] = f.sec;
    j["seconds_per_step_min"] = f.best_sec;
    j["elements_per_s"] = f.eps;
    j["bytes_per_element"] = std::uint64_t{f.bytes_per_element};
    j["gbps"] = f.gbps;
    if (r.reference) {
      j["rmw_gbps"] = f.rmw_gbps;
      j["rmw_bound_elements_per_s"] = f.bound_eps;
      j["ratio_to_rmw_bound"] = f.ratio;
      j["ratio_to_rmw_bound_best"] = f.ratio_best;
    }
    j["cpu"] = cpu_model();
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf(
      "cpu adam  isa=%s threads=%zu numel=%zu grad=%s copy-out=%s layout=%s steps=%llu "
      "(median)\n",
      isa.c_str(), r.adam.threads(), r.n, gt.c_str(), r.copy_text.c_str(),
      std::string(array_layout_name(r.layout)).c_str(), static_cast<unsigned long long>(r.steps));
  std::printf("  %-28s %10zu elements (%.*s)\n", "prefetch distance", prefetch.elements,
              static_cast<int>(prefetch.source.size()), prefetch.source.data());
  std::printf("  %-28s %10.3f ms\n", "seconds per step", f.sec * 1e3);
  std::printf("  %-28s %10.3f G/s\n", "elements per second", f.eps / 1e9);
  std::printf("  %-28s %10.2f GB/s  (%zu B/element)\n", "bandwidth", f.gbps, f.bytes_per_element);
  if (r.reference) {
    std::printf("  %-28s %10.2f GB/s  (a[i] += s*b[i], 12 B/element)\n", "read-modify-write",
                f.rmw_gbps);
    std::printf("  %-28s %10.3f G/s   (rmw GB/s / 28 B)\n", "memory bound", f.bound_eps / 1e9);
    std::printf("  %-28s %10.3f x\n", "adam / memory bound", f.ratio);
    std::printf("  %-28s %10.3f x   (fastest step / fastest pass)\n", "  best / best",
                f.ratio_best);
  }
}

}  // namespace

int bench_adam_main(const std::vector<std::string>& tokens) {
  std::uint64_t numel = 100'000'000, threads = 0, steps = 10;
  std::string isa_text = "auto", grad_text = "fp32", copy_text = "none", prefetch_text = "auto",
              layout_text = "aligned";
  bool reference = false, json = false;
  Cli cli("bench adam", kAbout);
  cli.count("--numel", numel, "elements", 0, UINT64_MAX, "1e8");
  cli.count("--threads", threads, "threads including the caller (0 = one per hardware thread)", 0,
            1024);  // CpuAdam's limit
  cli.text("--isa", isa_text, "ISA", "auto | avx512bf16 | avx512 | avx2 | sve | neon | scalar");
  cli.text("--prefetch", prefetch_text, "N",
           "auto | off | elements: the x86 paths' software prefetch distance (auto: calibrated "
           "by the first steps)");
  cli.text("--layout", layout_text, "L",
           "aligned | aligned-4k | staggered | torch: where the arrays lie (2 MiB aligned on huge "
           "pages, the same on 4 KiB pages, 2 MiB aligned and moved by 0/1088/2176/3264/4352 "
           "bytes, or posix_memalign(64) as torch.empty)");
  cli.text("--grad-dtype", grad_text, "T", "fp32 | bf16 | fp16");
  cli.text("--copy-out", copy_text, "T", "none | bf16 | fp16: also write low-precision parameters");
  cli.count("--steps", steps, "timed steps");
  cli.flag("--reference", reference, "alternate each step with the memory kernel (see above)");
  cli.flag("--json", json, "one JSON object on stdout instead of the table");
  if (!cli.parse(tokens)) return 0;
  const ElementType grad_dtype = parse_dtype(grad_text, "--grad-dtype");
  const ArrayLayout layout = parse_array_layout(layout_text, "--layout");

  // 2^36 elements is ~2 TB of state: far beyond any host, and keeps every byte count in range.
  check_numel(numel);
  if (steps == 0) throw UsageError("--steps must be at least 1");
  const std::optional<ElementType> copy_dtype = parse_copy_out(copy_text);
  CpuAdam adam({.threads = threads,
                .isa = adam::parse_isa(isa_text, "--isa"),
                .prefetch_elements = adam::parse_prefetch(prefetch_text, "--prefetch")});

  const std::size_t n = numel;
  const std::size_t grad_bytes = grad_dtype == ElementType::kF32 ? 4 : 2;
  HostArray p_mem(n * 4, "bench adam", layout, 0), m_mem(n * 4, "bench adam", layout, 1),
      v_mem(n * 4, "bench adam", layout, 2), g_mem(n * grad_bytes, "bench adam", layout, 3);
  std::optional<HostArray> out_mem;
  if (copy_dtype) out_mem.emplace(n * 2, "bench adam", layout, 4);
  auto p = p_mem.as<float>(n);
  auto m = m_mem.as<float>(n);
  auto v = v_mem.as<float>(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = bench_param(i);
    m[i] = 0.0f;
    v[i] = 0.0f;
  }
  fill_bench_grads(g_mem.as<std::byte>(n * grad_bytes).data(), n, grad_dtype);
  const GradView grads = grad_dtype == ElementType::kF32
                             ? GradView::f32(g_mem.as<const float>(n))
                             : GradView{g_mem.as<const std::uint16_t>(n).data(), n, grad_dtype};
  CopyOut out;
  if (copy_dtype) out = CopyOut{out_mem->as<std::uint16_t>(n).data(), n, *copy_dtype, true};

  std::optional<StreamRmw> rmw;
  std::optional<HostArray> a_mem, b_mem;
  if (reference) {
    rmw.emplace(adam.threads());
    // The memory kernel's two arrays at their best (staggered: no two share an offset mod
    // 4 KiB), whatever --layout says: the bound should not measure a layout's luck.
    a_mem.emplace(n * 4, "bench adam", ArrayLayout::kStaggered, 0);
    b_mem.emplace(n * 4, "bench adam", ArrayLayout::kStaggered, 1);
    auto a = a_mem->as<float>(n);
    auto b = b_mem->as<float>(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(i % 1024u);
      b[i] = 1.0f;
    }
  }

  adam::AdamParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.01;
  hp.mode = adam::AdamMode::kAdamW;
  std::vector<double> adam_s, rmw_s;
  for (std::uint64_t s = 0; s <= steps; ++s) {  // s == 0: untimed warm-up (first touch)
    throw_if_interrupted();
    hp.step = s + 1;
    const double t = time_seconds([&] { adam.step(hp, p, m, v, grads, out); });
    double r = 0;
    if (rmw) {
      // Alternating signs keep a[] bounded over any number of steps.
      const float sign = s % 2 == 0 ? 1.0f : -1.0f;
      r = time_seconds([&] { rmw->run(a_mem->as<float>(n), b_mem->as<const float>(n), sign); });
    }
    if (s == 0) continue;
    adam_s.push_back(t);
    if (rmw) rmw_s.push_back(r);
  }

  const AdamFigures figures(n, grad_bytes, copy_dtype.has_value(), adam_s, rmw_s);
  report({adam, n, grad_dtype, copy_text, layout, steps, reference}, figures, json);
  return 0;
}

}  // namespace zinf::tools
