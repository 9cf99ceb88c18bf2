// SPDX-License-Identifier: Apache-2.0
// The JSON under the config reader (config.cc): strict parsing with line and column for
// malformed input and duplicate keys refused, bounded against hostile input, and typed access
// to one block whose errors name the key's path. nlohmann::json stays private to zinf::offload:
// only config.cc and config_json.cc include this header. Private to zinf::offload.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "zinf/common/error.h"
#include "zinf/common/suggest.h"

namespace zinf::offload::detail {

// ordered_json keeps the file's key order, so the first error reported is the first in the file
// and config_to_json writes keys in the order the docs list them.
using Json = nlohmann::ordered_json;

/// `text`, cut to 80 characters with "..." if longer: an error line stays one line of
/// readable size whatever the input holds.
std::string clip(std::string_view text);

/// A value as JSON for an error message, clipped. Safe on any value parse_json returned: it
/// refuses nesting deeper than kConfigMaxDepth, so dump()'s recursion is bounded.
std::string shown(const Json& value);

/// Whether `key` is one of `keys`.
bool contains(std::span<const std::string_view> keys, std::string_view key);

/// Parses `text` as strict JSON for a config named `source` in errors: UsageError for text
/// over kConfigMaxBytes, nesting over kConfigMaxDepth, a duplicate key (naming its path) and
/// malformed JSON or a number beyond a double's range (naming line and column).
Json parse_json(std::string_view text, std::string_view source);

/// Typed access to one JSON object of a config. Every error is a UsageError
/// "<source>: <path>.<key>: <what>". Holds references: `object` and `notices` must outlive it.
class Block {
 public:
  Block(const Json& object, std::string path, std::string_view source,
        std::vector<std::string>* notices)
      : object_(object), path_(std::move(path)), source_(source), notices_(notices) {}

  std::string key_path(std::string_view key) const {
    return path_.empty() ? clip(key) : path_ + "." + clip(key);
  }
  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw UsageError(std::string(source_) + ": " + key_path(key) + ": " + what);
  }

  // Refuses keys outside `known` and `accepted` (suggesting the closest of either), and records
  // one notice listing the accepted keys present, which have no effect in zinf.
  void check_keys(std::span<const std::string_view> known,
                  std::span<const std::string_view> accepted = {}) const {
    std::vector<std::string> without_effect;
    for (const auto& item : object_.items()) {
      const std::string& key = item.key();
      if (contains(known, key)) continue;
      if (contains(accepted, key)) {
        without_effect.push_back(key);
        continue;
      }
      // Close means a typo, not a different word: at most 2 edits, or one per 4 characters.
      std::vector<std::string_view> candidates(known.begin(), known.end());
      candidates.insert(candidates.end(), accepted.begin(), accepted.end());
      const std::string_view best = closest_match(key, candidates, typo_distance(key, 4));
      std::string what = "unknown key";
      if (!best.empty()) what += "; did you mean '" + std::string(best) + "'?";
      fail(key, what);
    }
    if (!without_effect.empty()) {
      std::string line = (path_.empty() ? std::string("top level") : path_) +
                         ": accepted without effect in zinf: ";
      for (std::size_t i = 0; i < without_effect.size(); ++i) {
        line += (i == 0 ? "" : ", ") + without_effect[i];
      }
      notice(line);
    }
  }

  void notice(std::string line) const { notices_->push_back(std::move(line)); }

  const Json* find(std::string_view key) const {
    const auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }

  // A nested block: nullptr if absent or JSON null (DeepSpeed's Optional blocks), else it must
  // be an object.
  std::optional<Block> child(std::string_view key) const {
    const Json* v = find(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (!v->is_object()) fail(key, "expected an object {...}, got " + shown(*v));
    return Block(*v, key_path(key), source_, notices_);
  }

  void read_bool(std::string_view key, bool& out) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + shown(*v));
    out = v->get<bool>();
  }

  template <typename T>
  void read_uint(std::string_view key, T& out, T min = 0) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    out = to_uint<T>(key, *v, min);
  }

  // An unsigned integer; JSON floats such as 1e8 are accepted where integral (as DeepSpeed).
  template <typename T>
  T to_uint(std::string_view key, const Json& v, T min) const {
    constexpr std::uint64_t kMax = std::numeric_limits<T>::max();
    std::uint64_t value = 0;
    if (v.is_number_unsigned()) {
      value = v.get<std::uint64_t>();
    } else if (v.is_number_integer()) {
      fail(key, "expected a non-negative integer, got " + shown(v));
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) {
        fail(key, "expected an integer, got " + shown(v));
      }
      if (d < 0) fail(key, "expected a non-negative integer, got " + shown(v));
      // 2^64 is exactly representable; anything at or above it does not fit in uint64.
      if (d >= 18446744073709551616.0) {
        fail(key, shown(v) + " is out of range (at most " + std::to_string(kMax) + ")");
      }
      value = static_cast<std::uint64_t>(d);
    } else {
      fail(key, "expected an integer, got " + shown(v));
    }
    if (value > kMax) {
      fail(key, shown(v) + " is out of range (at most " + std::to_string(kMax) + ")");
    }
    if (value < min) {
      fail(key, shown(v) + " is too small (at least " + std::to_string(min) + ")");
    }
    return static_cast<T>(value);
  }

  double to_number(std::string_view key, const Json& v) const {
    if (!v.is_number()) fail(key, "expected a number, got " + shown(v));
    return v.get<double>();
  }

  void read_number(std::string_view key, double& out) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    out = to_number(key, *v);
  }

  // A string; `allow_null` for DeepSpeed's Optional[Path] (null means absent).
  void read_string(std::string_view key, std::string& out, bool allow_null = false) const {
    const Json* v = find(key);
    if (v == nullptr || (allow_null && v->is_null())) return;
    if (!v->is_string()) fail(key, "expected a string, got " + shown(*v));
    out = v->get<std::string>();
    // "\u0000" would cut a path where the OS stops reading it (a directory's parent).
    if (out.find('\0') != std::string::npos) fail(key, "the string has a NUL byte (\\u0000)");
  }

 private:
  const Json& object_;
  std::string path_;
  std::string_view source_;
  std::vector<std::string>* notices_;
};

}  // namespace zinf::offload::detail
