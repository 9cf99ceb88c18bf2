// SPDX-License-Identifier: Apache-2.0
// The config's JSON (config_json.h): strict parsing that says where input is malformed, and the
// helpers every error message uses.
#include "config_json.h"

#include <algorithm>
#include <iterator>
#include <set>

#include "zinf/offload/config.h"

namespace zinf::offload::detail {
namespace {

// Hostile-input bounds (config.h says why their values).
constexpr std::size_t kMaxConfigBytes = kConfigMaxBytes;
constexpr std::size_t kMaxDepth = kConfigMaxDepth;
// The most characters of a value or key an error message quotes.
constexpr std::size_t kMaxShown = 80;

}  // namespace

// `text`, cut to kMaxShown characters with "..." if longer: an error line stays one line of
// readable size whatever the input holds.
std::string clip(std::string_view text) {
  if (text.size() <= kMaxShown) return std::string(text);
  return std::string(text.substr(0, kMaxShown)) + "...";
}

// A value as JSON for an error message, clipped. Safe on any parsed value: parse_json refuses
// nesting deeper than kMaxDepth, so dump()'s recursion is bounded.
std::string shown(const Json& value) { return clip(value.dump()); }

bool contains(std::span<const std::string_view> keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

namespace {

// ---------------------------------------------------------------------------------------------
// Malformed JSON and duplicate keys.

// nlohmann's parser reads through an iterator; this one records how far it got, so that the
// duplicate-key callback (which nlohmann gives no position) can name a line and column. At a
// key event the lexer has read exactly through the key's closing quote.
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator() = default;
  CountingIterator(const char* p, const char* base, std::size_t* consumed)
      : p_(p), base_(base), consumed_(consumed) {}
  reference operator*() const { return *p_; }
  CountingIterator& operator++() {
    ++p_;
    if (consumed_ != nullptr) *consumed_ = static_cast<std::size_t>(p_ - base_);
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator before = *this;
    ++*this;
    return before;
  }
  friend bool operator==(const CountingIterator& a, const CountingIterator& b) {
    return a.p_ == b.p_;
  }

 private:
  const char* p_ = nullptr;
  const char* base_ = nullptr;
  std::size_t* consumed_ = nullptr;
};

// "line L, column C" of the character before byte offset `end` (1-based, columns in bytes).
std::string line_column(std::string_view text, std::size_t end) {
  std::size_t line = 1;
  std::size_t column = 0;
  for (std::size_t i = 0; i < end && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 0;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " +
         std::to_string(std::max<std::size_t>(column, 1));
}

// One open object or array while parsing: what it is, the keys seen so far (objects), and the
// current key or element index, which together spell the JSON path of a duplicate key.
struct Frame {
  bool is_object = true;
  std::set<std::string> keys;
  std::string key;
  std::size_t index = 0;
};

std::string frames_path(const std::vector<Frame>& frames, std::string_view last) {
  std::string path;
  // frames[0] is the root object; each deeper frame is named by its parent's current key/index.
  for (std::size_t i = 0; i + 1 < frames.size(); ++i) {
    const Frame& parent = frames[i];
    if (parent.is_object) {
      if (!path.empty()) path += '.';
      path += clip(parent.key);
    } else {
      path += '[' + std::to_string(parent.index) + ']';
    }
  }
  if (!path.empty()) path += '.';
  path += clip(last);
  return path;
}

// The JSON path of the value being read now: every open frame's current key or index
// ("optimizer.params.lr", "optimizer.params.betas[1]"); "" at the top level.
std::string current_path(const std::vector<Frame>& frames) {
  std::string path;
  for (const Frame& frame : frames) {
    if (frame.is_object) {
      if (!path.empty()) path += '.';
      path += clip(frame.key);
    } else {
      path += '[' + std::to_string(frame.index) + ']';
    }
  }
  return path;
}

}  // namespace

Json parse_json(std::string_view text, std::string_view source) {
  if (text.size() > kMaxConfigBytes) {
    throw UsageError(std::string(source) + ": the config is larger than the limit of " +
                     std::to_string(kMaxConfigBytes) + " bytes (16 MiB)");
  }
  std::size_t consumed = 0;
  std::vector<Frame> frames;
  const auto element_done = [&frames] {
    if (!frames.empty() && !frames.back().is_object) ++frames.back().index;
  };
  const Json::parser_callback_t callback = [&](int /*depth*/, Json::parse_event_t event,
                                               Json& parsed) -> bool {
    using Event = Json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        // Refused as the level opens, so nothing (parser, value, destructor or error message)
        // ever holds deeper input.
        if (frames.size() >= kMaxDepth) {
          throw UsageError(std::string(source) + ": " + line_column(text, consumed) +
                           ": nesting deeper than " + std::to_string(kMaxDepth) +
                           " levels of objects and arrays (the limit of a config)");
        }
        frames.push_back(Frame{event == Event::object_start, {}, {}, 0});
        break;
      case Event::key: {
        Frame& top = frames.back();
        std::string key = parsed.get<std::string>();
        if (!top.keys.insert(key).second) {
          throw UsageError(std::string(source) + ": " + line_column(text, consumed) + ": " +
                           frames_path(frames, key) +
                           ": duplicate key (DeepSpeed would silently keep the last value)");
        }
        top.key = std::move(key);
        break;
      }
      case Event::object_end:
      case Event::array_end:
        frames.pop_back();
        element_done();
        break;
      case Event::value: element_done(); break;
    }
    return true;
  };
  try {
    return Json::parse(CountingIterator(text.data(), text.data(), &consumed),
                       CountingIterator(text.data() + text.size(), text.data(), nullptr), callback,
                       /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error
    // while parsing object - unexpected '}'; expected string literal". Keep what follows the
    // position; compute the position from e.byte so it does not depend on the message format.
    std::string what = e.what();
    const std::size_t column_at = what.find(", column ");
    const std::size_t colon =
        column_at == std::string::npos ? what.find(": ") : what.find(": ", column_at);
    if (colon != std::string::npos) what = what.substr(colon + 2);
    // The message quotes the last token read, which can be as long as the input.
    if (what.size() > 2 * kMaxShown) what = what.substr(0, 2 * kMaxShown) + "...";
    throw UsageError(std::string(source) + ": " + line_column(text, e.byte) + ": " + what);
  } catch (const Json::out_of_range& e) {
    // nlohmann throws this (406, "number overflow parsing '1e309'") for a number beyond a
    // double's range, with no position; the frames still say which key it was read for.
    // The number ends just before the lexer's position (which may be one lookahead past it).
    const auto in_number = [&](std::size_t i) {
      return std::string_view("0123456789+-.eE").find(text[i]) != std::string_view::npos;
    };
    std::size_t end = std::min(consumed, text.size());
    if (end > 0 && !in_number(end - 1)) --end;
    std::size_t begin = end;
    while (begin > 0 && in_number(begin - 1)) --begin;
    const std::string token = clip(text.substr(begin, end - begin));
    const std::string path = current_path(frames);
    throw UsageError(std::string(source) + ": " + line_column(text, begin + 1) + ": " +
                     (path.empty() ? std::string() : path + ": ") + "number out of range (" +
                     token + " is beyond a double's +-1.8e308)");
  }
}

}  // namespace zinf::offload::detail
