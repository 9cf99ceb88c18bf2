// SPDX-License-Identifier: Apache-2.0
// CpuAdam micro-benchmarks and, in the same run, its references: BM_StreamRmw (the memory
// bound, elements/s = its bytes/s / 28) and BM_NativeAdamLoop (a plain loop built with -O3
// -march=native). All use the same huge-page-advised arrays. Compare items_per_second.
// BM_CpuAdamLayout and BM_SimpleAdamLoopNativeLayout time the kernel and the simple loop on
// several memory layouts of the four arrays (see Layout): a benchmark that measures one
// layout measures its luck (issue #37).
// Quiet-machine recipe (alternates the cases, medians of 5):
//   build/release/bench/adam_bench --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <sys/mman.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "native_adam_loop.h"
#include "zinf/adam/cpu_adam.h"
#include "zinf/adam/reference_kernels.h"
#include "zinf/common/align.h"

namespace {

using zinf::align_up;
using zinf::ElementType;
using zinf::adam::AdamParams;
using zinf::adam::CopyOut;
using zinf::adam::CpuAdam;
using zinf::adam::GradView;
using zinf::adam::Isa;
using zinf::adam::StreamRmw;

constexpr std::int64_t kLarge = 100'000'000;   // the size: ~2.8 GB moved per step
constexpr std::int64_t kCached =
    262'144;  // 4 MiB of state: in this CPU's caches, the compute bound
constexpr std::int64_t kBytesPerElement = 28;  // p, m, v read+write and an fp32 gradient read

// One 2 MiB-aligned, THP-advised array, allocated once and reused by every benchmark so page
// faults are paid once (outside the timed loops).
class Array {
 public:
  explicit Array(std::size_t bytes) {
    constexpr std::size_t kAlign = std::size_t{2} << 20;
    bytes_ = align_up(bytes, kAlign);
    ptr_.reset(std::aligned_alloc(kAlign, bytes_));
    if (!ptr_) throw std::bad_alloc();
    (void)::madvise(ptr_.get(), bytes_, MADV_HUGEPAGE);  // advisory
    std::memset(ptr_.get(), 0, bytes_);
  }
  template <typename T>
  std::span<T> as(std::size_t n) {
    return {static_cast<T*>(ptr_.get()), n};
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  std::size_t bytes_ = 0;
};

// Parameters in [-1, 1], gradients around 1e-3 (fp32, bf16 and fp16 copies): every value
// stays a normal float through the steps, so no subnormal slow path is measured.
struct Arena {
  explicit Arena(std::size_t size)
      : n(size), p(n * 4), m(n * 4), v(n * 4), g(n * 4), gbf(n * 2), g16(n * 2), out(n * 2) {
    auto ps = p.as<float>(n);
    auto gs = g.as<float>(n);
    auto gb = gbf.as<std::uint16_t>(n);
    auto gh = g16.as<std::uint16_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto h = static_cast<std::uint32_t>(i * 2654435761u);
      ps[i] = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
      gs[i] = (static_cast<float>((h >> 11) % 2001u) / 1000.0f - 1.0f) * 1e-3f + 1e-5f;
      gb[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(gs[i]) >> 16);
      gh[i] = static_cast<std::uint16_t>(0x1400u | (h & 0x83ffu));  // +-2^-10 * (1 + f)
    }
  }
  std::span<const std::uint16_t> narrow(ElementType t, std::size_t count) {
    return (t == ElementType::kBF16 ? gbf : g16).as<const std::uint16_t>(count);
  }
  std::size_t n;
  Array p, m, v, g, gbf, g16, out;
};

Arena& arena(std::size_t n) {
  static std::unique_ptr<Arena> a;
  if (!a || a->n < n) {
    a.reset();
    a = std::make_unique<Arena>(n);
  }
  return *a;
}

// Where the four fp32 arrays (parameters, m, v, gradients) of the layout rows lie. What
// matters to the kernel is how far apart the arrays are mod 1 MiB and whether they sit on huge
// pages (loads and stores are first matched on the low 20 bits of the physical address, which
// on 2 MiB pages are the virtual ones: adam/src/loop_order.h).
enum Layout : std::int64_t {
  // Each array from posix_memalign(64, bytes), as torch.empty's CPU allocator takes it: glibc
  // maps a large block on its own pages, so every array starts at the same small offset into a
  // page; no huge-page advice.
  kTorch = 0,
  // Each array 2 MiB-aligned and THP-advised (zinf's HostArray, `zinf bench adam`, BufferPool):
  // every array at offset 0 mod 2 MiB.
  kAlignedThp = 1,
  // The same addresses on 4 KiB pages (MADV_NOHUGEPAGE).
  kAligned4K = 2,
  // 2 MiB-aligned, THP, array k moved by k * 1088 bytes: no two arrays share an offset mod 4 KiB
  // or sit within a few cache lines of each other there.
  kStaggered = 3,
  // 2 MiB-aligned, THP, array k moved by k * 64 bytes: each array one cache line past the last
  // mod 1 MiB, the layout the kernels lost most on before issue #37's fixes.
  kLines = 4,
};

constexpr std::size_t kTwoMiB = std::size_t{2} << 20;

// The four arrays of one layout, allocated and filled as Arena's are. `stagger` (bytes)
// replaces kStaggered's 1088 when given: the offset sweep's rows.
class LayoutArena {
 public:
  LayoutArena(std::size_t n_in, Layout layout_in, std::size_t stagger_in = 1088)
      : n(n_in), layout(layout_in), stagger(stagger_in) {
    float* arrays[4];
    for (std::size_t k = 0; k < 4; ++k) arrays[k] = allocate(n * 4, k);
    p = arrays[0];
    m = arrays[1];
    v = arrays[2];
    g = arrays[3];
    for (std::size_t i = 0; i < n; ++i) {
      const auto h = static_cast<std::uint32_t>(i * 2654435761u);
      p[i] = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
      g[i] = (static_cast<float>((h >> 11) % 2001u) / 1000.0f - 1.0f) * 1e-3f + 1e-5f;
      m[i] = 0.0f;
      v[i] = 0.0f;
    }
  }
  std::size_t n;
  Layout layout;
  std::size_t stagger;
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* g = nullptr;

 private:
  struct Free {
    void operator()(void* q) const { std::free(q); }
  };
  float* allocate(std::size_t bytes, std::size_t k) {
    void* block = nullptr;
    std::size_t offset = 0;
    if (layout == kTorch) {
      if (::posix_memalign(&block, 64, bytes) != 0) throw std::bad_alloc();
    } else {
      offset = layout == kStaggered ? k * stagger : layout == kLines ? k * 64 : 0;
      const std::size_t size = align_up(bytes + offset, kTwoMiB);
      block = std::aligned_alloc(kTwoMiB, size);
      if (block == nullptr) throw std::bad_alloc();
      (void)::madvise(block, size, layout == kAligned4K ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    }
    blocks_.emplace_back(block);
    return reinterpret_cast<float*>(static_cast<std::byte*>(block) + offset);
  }
  std::vector<std::unique_ptr<void, Free>> blocks_;
};

// One layout at a time (1.6 GB at 100M elements): rebuilt, outside the timed loop, when a row
// asks for another layout or size.
LayoutArena& layout_arena(std::size_t n, Layout layout, std::size_t stagger = 1088) {
  static std::unique_ptr<LayoutArena> a;
  if (!a || a->n != n || a->layout != layout || a->stagger != stagger) {
    a.reset();
    a = std::make_unique<LayoutArena>(n, layout, stagger);
  }
  return *a;
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case kTorch: return "torch";
    case kAlignedThp: return "aligned";
    case kAligned4K: return "aligned-4k";
    case kStaggered: return "staggered";
    case kLines: return "lines";
  }
  return "?";
}

AdamParams bench_params(std::int64_t step) {
  AdamParams hp;
  hp.lr = 1e-3;
  hp.step = static_cast<std::uint64_t>(step);
  return hp;  // no weight decay: the same arithmetic as BM_NativeAdamLoop
}

// Args: numel, threads, isa (Isa enumerator), grad dtype, copy-out (-1 none, else ElementType).
void BM_CpuAdam(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto isa = static_cast<Isa>(state.range(2));
  if (!zinf::adam::isa_supported(isa)) {
    state.SkipWithError("isa not supported on this machine");
    return;
  }
  const auto grad_dtype = static_cast<ElementType>(state.range(3));
  const std::int64_t out_code = state.range(4);
  CpuAdam adam({.threads = static_cast<std::size_t>(state.range(1)), .isa = isa});
  Arena& a = arena(n);
  const GradView grads = grad_dtype == ElementType::kF32
                             ? GradView::f32(a.g.as<const float>(n))
                             : GradView{a.narrow(grad_dtype, n).data(), n, grad_dtype};
  CopyOut out;
  if (out_code >= 0)
    out = {a.out.as<std::uint16_t>(n).data(), n, static_cast<ElementType>(out_code), true};
  std::int64_t step = 1;
  for (auto _ : state) {
    adam.step(bench_params(step++), a.p.as<float>(n), a.m.as<float>(n), a.v.as<float>(n), grads,
              out);
    benchmark::ClobberMemory();
  }
  const std::int64_t bytes =
      24 + (grad_dtype == ElementType::kF32 ? 4 : 2) + (out_code >= 0 ? 2 : 0);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) * bytes);
  state.SetLabel(std::string(zinf::adam::isa_name(isa)));
}

// The memory reference; items/s reported as the Adam bound (bytes/s / 28), bytes/s as moved.
void BM_StreamRmw(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  StreamRmw rmw(static_cast<std::size_t>(state.range(1)));
  Arena& a = arena(n);
  float sign = 1.0f;
  for (auto _ : state) {
    // m and v as a and b: Adam's own arrays, and alternating signs keep the values bounded.
    rmw.run(a.m.as<float>(n), a.v.as<const float>(n), sign);
    sign = -sign;
    benchmark::ClobberMemory();
  }
  const auto bytes = state.iterations() * static_cast<std::int64_t>(n) *
                     static_cast<std::int64_t>(StreamRmw::kBytesPerElement);
  state.SetBytesProcessed(bytes);
  state.SetItemsProcessed(bytes / kBytesPerElement);
  state.SetLabel("items = bytes/28 (Adam bound)");
}

using LoopFn = void (*)(float*, float*, float*, const float*, std::size_t, float, float, float,
                        float, float, float);

void run_native_loop(benchmark::State& state, LoopFn loop) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Arena& a = arena(n);
  std::int64_t step = 1;
  for (auto _ : state) {
    const auto t = static_cast<double>(step++);
    loop(a.p.as<float>(n).data(), a.m.as<float>(n).data(), a.v.as<float>(n).data(),
         a.g.as<const float>(n).data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f,
         static_cast<float>(1 - std::pow(0.9, t)), static_cast<float>(1 - std::pow(0.999, t)));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) * kBytesPerElement);
}

// The plain loop as written (GCC 12 keeps it scalar: sqrtf must be able to set errno).
void BM_NativeAdamLoop(benchmark::State& state) {
  run_native_loop(state, zinf::bench::native_adam_loop);
}

// The same loop vectorised by the compiler for this CPU: the stronger reference.
void BM_NativeAdamLoopVectorized(benchmark::State& state) {
  run_native_loop(state, zinf::bench::native_adam_loop_vectorized);
}

// The simple form (load once, compute, store once; one division), for this CPU: the 1-thread
// target of the vector paths.
void BM_SimpleAdamLoopNative(benchmark::State& state) {
  run_native_loop(state, zinf::bench::simple_adam_loop_native);
}

// The same source for the baseline ISA (SSE2, no FMA on x86-64): the scalar path's target.
void BM_SimpleAdamLoopBaseline(benchmark::State& state) {
  run_native_loop(state, zinf::bench::simple_adam_loop_baseline);
}

// Args: numel, threads, layout. The best path, fp32 gradients, no copy-out, the simple loop's
// arithmetic (no weight decay).
void BM_CpuAdamLayout(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto layout = static_cast<Layout>(state.range(2));
  CpuAdam adam({.threads = static_cast<std::size_t>(state.range(1))});
  LayoutArena& a = layout_arena(n, layout);
  std::int64_t step = 1;
  for (auto _ : state) {
    adam.step(bench_params(step++), {a.p, n}, {a.m, n}, {a.v, n},
              GradView::f32({static_cast<const float*>(a.g), n}));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) * kBytesPerElement);
  state.SetLabel(std::string(layout_name(layout)) + " " +
                 std::string(zinf::adam::isa_name(adam.isa())));
}

// Args: numel, stagger (bytes). The offset sweep behind issue #37: 2 MiB-aligned THP arrays,
// array k (p, m, v, g) moved by k * stagger bytes, one thread, in L2.
void BM_CpuAdamStagger(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto stagger = static_cast<std::size_t>(state.range(1));
  CpuAdam adam({.threads = 1});
  LayoutArena& a = layout_arena(n, kStaggered, stagger);
  std::int64_t step = 1;
  for (auto _ : state) {
    adam.step(bench_params(step++), {a.p, n}, {a.m, n}, {a.v, n},
              GradView::f32({static_cast<const float*>(a.g), n}));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetLabel(std::string(zinf::adam::isa_name(adam.isa())));
}

// Args: numel, stagger (bytes), gradient ElementType (bf16 or fp16). The offset sweep with 2-byte
// gradients in the gradient array's place: they drift against the 4-byte arrays by 2 bytes an
// element, so they lie close to the fp32 arrays mod 1 MiB only over short stretches, and the
// loop-order choice leaves them out (adam/src/loop_order.h). These rows check that.
void BM_CpuAdamStaggerNarrow(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto stagger = static_cast<std::size_t>(state.range(1));
  const auto grad_dtype = static_cast<ElementType>(state.range(2));
  CpuAdam adam({.threads = 1});
  LayoutArena& a = layout_arena(n, kStaggered, stagger);
  // The narrow copy of the gradients, written over the start of the gradient array (4n bytes
  // hold 2n) before each timed loop and restored after, so that the arena stays fp32 for the
  // other rows.
  const std::vector<float> saved(a.g, a.g + n);
  auto* narrow = reinterpret_cast<std::uint16_t*>(a.g);
  const std::span<const std::uint16_t> src = arena(n).narrow(grad_dtype, n);
  std::copy(src.begin(), src.end(), narrow);
  std::int64_t step = 1;
  for (auto _ : state) {
    adam.step(bench_params(step++), {a.p, n}, {a.m, n}, {a.v, n}, GradView{narrow, n, grad_dtype});
    benchmark::ClobberMemory();
  }
  std::copy(saved.begin(), saved.end(), a.g);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetLabel(std::string(zinf::adam::isa_name(adam.isa())) + " " +
                 std::string(zinf::element_type_name(grad_dtype)));
}

// Args: numel, layout. The 1-thread reference on the same layouts.
void BM_SimpleAdamLoopNativeLayout(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto layout = static_cast<Layout>(state.range(1));
  LayoutArena& a = layout_arena(n, layout);
  std::int64_t step = 1;
  for (auto _ : state) {
    const auto t = static_cast<double>(step++);
    zinf::bench::simple_adam_loop_native(a.p, a.m, a.v, a.g, n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                         static_cast<float>(1 - std::pow(0.9, t)),
                                         static_cast<float>(1 - std::pow(0.999, t)));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n) * kBytesPerElement);
  state.SetLabel(layout_name(layout));
}

constexpr std::int64_t kNone = -1;
constexpr auto kF32 = static_cast<std::int64_t>(ElementType::kF32);
constexpr auto kBF16 = static_cast<std::int64_t>(ElementType::kBF16);
constexpr auto kF16 = static_cast<std::int64_t>(ElementType::kF16);
constexpr auto kBest = static_cast<std::int64_t>(Isa::kAvx512Bf16);

// The comparisons: 100M fp32 elements on 1 and 2 threads, every ISA.
BENCHMARK(BM_CpuAdam)
    ->ArgNames({"numel", "threads", "isa", "grad", "out"})
    ->ArgsProduct({{kLarge},
                   {1, 2},
                   {static_cast<std::int64_t>(Isa::kAvx512Bf16),
                    static_cast<std::int64_t>(Isa::kAvx512), static_cast<std::int64_t>(Isa::kAvx2),
                    static_cast<std::int64_t>(Isa::kScalar)},
                   {kF32},
                   {kNone}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The portable path against its reference with the state in the caches: the compute bound (at
// the baseline ISA both are bound by the divider, one sqrt and one division per element).
BENCHMARK(BM_CpuAdam)
    ->ArgNames({"numel", "threads", "isa", "grad", "out"})
    ->ArgsProduct({{kCached}, {1}, {static_cast<std::int64_t>(Isa::kScalar)}, {kF32}, {kNone}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// Narrow gradients and the fused copy-out, on the best path.
BENCHMARK(BM_CpuAdam)
    ->ArgNames({"numel", "threads", "isa", "grad", "out"})
    ->ArgsProduct({{kLarge}, {1, 2}, {kBest}, {kBF16, kF16}, {kNone, kBF16}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamRmw)
    ->ArgNames({"numel", "threads"})
    ->ArgsProduct({{kLarge}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NativeAdamLoop)
    ->ArgNames({"numel"})
    ->Arg(kLarge)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NativeAdamLoopVectorized)
    ->ArgNames({"numel"})
    ->Arg(kLarge)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimpleAdamLoopNative)
    ->ArgNames({"numel"})
    ->Arg(kLarge)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimpleAdamLoopBaseline)
    ->ArgNames({"numel"})
    ->Arg(kLarge)
    ->Arg(kCached)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Every layout, at 100M elements (memory-bound) and at 65,536 (1 MiB of state, in L2: the
// compute bound, where the layout's cost shows without the memory system's noise; one chunk,
// so one thread).
constexpr std::int64_t kInL2 = 65'536;
BENCHMARK(BM_CpuAdamLayout)
    ->ArgNames({"numel", "threads", "layout"})
    ->ArgsProduct({{kLarge}, {1, 2}, {kTorch, kAlignedThp, kAligned4K, kStaggered, kLines}})
    ->ArgsProduct({{kInL2}, {1}, {kTorch, kAlignedThp, kAligned4K, kStaggered, kLines}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimpleAdamLoopNativeLayout)
    ->ArgNames({"numel", "layout"})
    ->ArgsProduct({{kLarge, kInL2}, {kTorch, kAlignedThp, kAligned4K, kStaggered, kLines}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Each array k moved by k * stagger bytes: 0 (all aligned), a quarter, half, three quarters
// and one cache line, one and a quarter, one and a half, one and three quarters, two, three,
// four lines, 512 and 1088 bytes, and -16 (4080) mod 4 KiB. ZINF_CPU_ADAM_ISA picks the path.
// Timed in the calling thread's CPU time, which at one thread is the whole step: on a shared
// machine another process's turn on the core then costs the row nothing.
BENCHMARK(BM_CpuAdamStagger)
    ->ArgNames({"numel", "stagger"})
    ->ArgsProduct({{kInL2}, {0, 16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 512, 1088, 4080}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CpuAdamStaggerNarrow)
    ->ArgNames({"numel", "stagger", "grad"})
    ->ArgsProduct({{kInL2},
                   {0, 16, 32, 48, 64, 96, 128, 1088},
                   {static_cast<std::int64_t>(ElementType::kBF16),
                    static_cast<std::int64_t>(ElementType::kF16)}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
