// SPDX-License-Identifier: Apache-2.0
// The tool's --json output, written with nlohmann::json (nlohmann-json3-dev, which the library
// already reads its config with): one document per line, keys in the order the code sets
// them, doubles as the shortest text that reads back as the same double (consumers compute
// with them), and a non-finite double as null.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace zinf::tools {

/// A JSON value whose object keys keep their insertion order, so output reads as written.
using Json = nlohmann::ordered_json;

/// `j` on one line. Bytes that are not UTF-8 (a directory or CPU name can hold any) become
/// U+FFFD rather than an exception: the figures matter more than one character of a name.
inline std::string json_text(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace zinf::tools
