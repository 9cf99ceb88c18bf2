// SPDX-License-Identifier: Apache-2.0
// A small strict JSON reader for the tool's own files (`zinf plan --tune` reads `zinf tune`'s
// report): a value tree and one-line errors with line and column.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zinf::tools {

/// One parsed JSON value. Objects keep their members in file order.
struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  /// The member `key` of an object, or nullptr (also for non-objects).
  const JsonValue* find(std::string_view key) const;
};

/// Parses `text` (RFC 8259, no extensions). Throws UsageError
/// "<source>: line L column C: <what>" on malformed input.
JsonValue parse_json(std::string_view text, std::string_view source);

}  // namespace zinf::tools
